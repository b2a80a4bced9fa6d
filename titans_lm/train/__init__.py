"""Training: mesh and sharding rules (sharding), optimiser (optimizer), train state (state), the
pure train/eval steps (step), checkpoints (checkpoint), metric files (writers) and the loop
(loop.train). Import the submodules directly; this package imports nothing heavy on its own."""
