"""``dl2ray-a3c``: argument handling that needs no Ray."""

from __future__ import annotations

from clusters.cli import _expand_multi, main


def test_agents_list_is_expanded_for_click() -> None:
    assert _expand_multi(["bench", "--agents", "1", "2", "--seconds", "3"]) == [
        "bench", "--agents", "1", "--agents", "2", "--seconds", "3"]


def test_bad_out_is_a_user_error(capsys) -> None:
    try:
        main(["train", "--out", "x.txt", "--updates", "1"])
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    assert code == 2
    assert "expected a .pt checkpoint path" in capsys.readouterr().err
