"""Progress output of the training loop: the bar shows each step with that step's loss; a
terminal of zero width (or none) gets plain lines instead."""

import os
import pty
import struct


import pytest

from _tiny_run import tiny_config
from titans_lm.train import loop
from titans_lm.train.writers import read_metrics


@pytest.mark.parametrize("cols", [0, 80])
def test_terminal_columns(cols):
    import fcntl
    import termios
    master, slave = pty.openpty()
    try:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
        with os.fdopen(os.dup(slave), "w") as tty:
            assert loop._terminal_columns(tty) == cols
    finally:
        os.close(master)
        os.close(slave)
    assert loop._terminal_columns(open(os.devnull, "w")) == 0  # not a terminal


def test_bar_shows_each_step_with_its_own_loss(tmp_path, monkeypatch):
    shown = []

    class Recording(loop.tqdm):  # records what every redraw shows, redrawing at every update
        def __init__(self, *a, **kw):
            kw.update(mininterval=0, miniters=1, file=open(os.devnull, "w"))
            super().__init__(*a, **kw)

        def display(self, *a, **kw):
            shown.append((self.n, self.postfix))
            return super().display(*a, **kw)

    monkeypatch.setattr(loop, "tqdm", Recording)
    monkeypatch.setattr(loop, "_terminal_columns", lambda stream: 80)
    cfg = tiny_config(tmp_path / "cache", train__steps=4, train__ckpt_every=100,
                      train__eval_every=100, train__log_every=3)
    result = loop.train(cfg, tmp_path / "run", progress=True, log=lambda m: None)
    # logged: every log_every steps, the last, and the first (a short run draws a line)
    assert [r["step"] for r in read_metrics(tmp_path / "run") if "loss" in r] == [1, 3, 4]
    with_loss = [(n, p) for n, p in shown if p and n >= 1]
    assert {n for n, _ in with_loss} == {1, 2, 3, 4}, shown
    for n, postfix in with_loss:
        assert f"loss={result.losses[n]:.4f}" in postfix, (n, postfix, result.losses)

