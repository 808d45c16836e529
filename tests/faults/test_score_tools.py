"""The scripts that score and time the classifier over the corpora (docs/gpu-hangs.md says
how to run them): they read every corpus and print what the docs show."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import classifier_score, classifier_speed


def test_score_prints_each_file_and_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    heldout = classifier_score.DATA / "kernel-log-heldout.tsv"
    assert classifier_score.main([str(heldout), "--misses"]) == 0
    out = capsys.readouterr().out
    assert "kernel-log-heldout.tsv: 107/107 right (100.0%), 0 benign called a fault" in out
    assert "| vendor | lines | of them benign | right | accuracy | sources |" in out
    assert "| card does not come up |" in out


def test_score_refuses_a_file_without_the_corpus_header(tmp_path: Path) -> None:
    bad = tmp_path / "x.tsv"
    bad.write_text("line\tclass\nNVRM: x\tbenign\n", encoding="utf-8")
    with pytest.raises(ValueError, match="header"):
        classifier_score.read_rows(bad)


def test_speed_feeds_every_corpus_line(capsys: pytest.CaptureFixture[str]) -> None:
    lines = classifier_speed.corpus_lines()
    assert len(lines) >= 600
    assert classifier_speed.main(["--rounds", "1"]) == 0
    assert f"{len(lines)} lines x 1 rounds" in capsys.readouterr().out
