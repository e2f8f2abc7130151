import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from tutorial_utils.articles.models import NetA
from tutorial_utils.checkpointing.strategy import equal_segments
from tutorial_utils.training import loop
from tutorial_utils.training.loop import atomic_save, train_model

ARTICLE_LINE = re.compile(
    r"^Epoch=(\d+) Train Accuracy=\S+ Train loss=\S+ Validation accuracy=\S+ "
    r"Validation loss=\S+ Memory used=\S+ MB"
)


def tiny_problem(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 6, generator=generator)
    y = (x[:, 0] > 0).long()
    train = DataLoader(TensorDataset(x[:30], y[:30]), batch_size=8)
    val = DataLoader(TensorDataset(x[30:], y[30:]), batch_size=4)
    return train, val


def tiny_model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 2))


def run(model, epochs, checkpoint_dir=None, strategy=None, lines=None, **kwargs):
    train, val = tiny_problem()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    return train_model(
        model,
        nn.CrossEntropyLoss(),
        optimizer,
        train,
        val,
        epochs=epochs,
        strategy=strategy,
        options=loop.TrainingOptions(
            checkpoint_dir=checkpoint_dir,
            progress=False,
            log=(lines.append if lines is not None else None),
            **kwargs,
        ),
    )


def test_one_loop_logs_the_article_line_and_records_every_epoch(tmp_path):
    lines: list[str] = []
    history = run(
        tiny_model(), 2, tmp_path / "ckpt", equal_segments(2), lines=lines, track_memory=True
    )
    assert [r.epoch for r in history.records] == [0, 1]
    epoch_lines = [line for line in lines if ARTICLE_LINE.match(line)]
    assert [int(ARTICLE_LINE.match(line).group(1)) for line in epoch_lines] == [0, 1]
    folder = os.path.relpath(tmp_path / "ckpt")
    assert lines[1].startswith(f"wrote {folder}/epoch_0.pt, training_state_0.pt (")
    first = history.records[0]
    assert first.seconds > 0 and first.samples_per_second > 0
    assert 0 <= first.val_accuracy <= 100
    parameter_bytes = sum(p.numel() * 4 for p in tiny_model().parameters())
    assert first.tracked_peak_mib * 2**20 > parameter_bytes
    assert first.nvml_used_mib is None and first.cuda_peak_allocated_mib is None  # CPU
    # by default only the latest epoch stays on disk: all a resume needs
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "epoch_1.pt",
        "training_state_1.pt",
    ]
    state = torch.load(tmp_path / "ckpt" / "epoch_1.pt", weights_only=True)
    assert set(state) == set(tiny_model().state_dict())  # the article's bare state_dict


def test_keep_every_epoch_writes_the_articles_file_per_epoch(tmp_path):
    run(tiny_model(), 2, tmp_path, keep_every_epoch=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "epoch_0.pt",
        "epoch_1.pt",
        "training_state_0.pt",
        "training_state_1.pt",
    ]


@pytest.mark.parametrize("keep_every_epoch", [False, True])
def test_resuming_continues_exactly_where_an_uninterrupted_run_would_be(tmp_path, keep_every_epoch):
    uninterrupted = tiny_model()
    run(uninterrupted, 3)
    interrupted = tiny_model()
    run(interrupted, 2, tmp_path, keep_every_epoch=keep_every_epoch)
    resumed = tiny_model()  # fresh weights: everything must come from the files
    lines: list[str] = []
    history = run(resumed, 3, tmp_path, lines=lines, keep_every_epoch=keep_every_epoch)
    assert [r.epoch for r in history.records] == [0, 1, 2]
    assert len(lines) == 2 and lines[0].startswith("Epoch=2 ") and lines[1].startswith("wrote ")
    for a, b in zip(resumed.parameters(), uninterrupted.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_a_failed_save_leaves_the_previous_file_intact(tmp_path, monkeypatch):
    target = tmp_path / "epoch_0.pt"
    atomic_save({"w": torch.ones(3)}, target)

    def broken_save(obj, handle):
        handle.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        atomic_save({"w": torch.zeros(3)}, target)
    assert torch.equal(torch.load(target, weights_only=True)["w"], torch.ones(3))
    assert os.listdir(tmp_path) == ["epoch_0.pt"]


def test_test_model_is_a_true_per_sample_mean_with_uneven_batches():
    model = nn.Linear(3, 2)
    x, y = torch.randn(10, 3), torch.randint(0, 2, (10,))
    loader = DataLoader(TensorDataset(x, y), batch_size=4)  # batches of 4, 4, 2
    accuracy, loss = loop.test_model(model, loader, nn.CrossEntropyLoss())
    with torch.no_grad():
        expected_loss = nn.CrossEntropyLoss()(model(x), y).item()
        expected_accuracy = 100.0 * (model(x).argmax(1) == y).float().mean().item()
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert accuracy == pytest.approx(expected_accuracy)


def test_segments_on_a_model_that_checkpoints_itself_is_a_clear_error():
    train, val = tiny_problem()
    model = NetA(use_checkpoint=True)
    with pytest.raises(ValueError, match="NO_CHECKPOINTING for a model that checkpoints itself"):
        train_model(
            model,
            nn.CrossEntropyLoss(),
            torch.optim.Adam(model.parameters()),
            train,
            val,
            1,
            strategy=equal_segments(2),
            options=loop.TrainingOptions(progress=False),
        )


def test_zero_epochs_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 1"):
        run(tiny_model(), 0)


@pytest.mark.slow  # its module's unit of work starts early, not last (tests/schedule.py)
@pytest.mark.parametrize(
    "experiment,segments", [("vgg16-dogcat", "segments-2"), ("neta-cifar10", "segments-5")]
)
def test_command_line_trains_on_generated_data_and_prints_the_log_and_a_summary(
    experiment, segments, tmp_path
):
    env = {**os.environ, "TUTORIAL_PROFILE": "ci", "TUTORIAL_DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tutorial_utils",
            "train",
            "--experiment",
            experiment,
            "--data",
            "synthetic",
            "--strategy",
            segments,
            "--epochs",
            "1",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert any(ARTICLE_LINE.match(line) for line in result.stdout.splitlines())
    summary = json.loads(result.stdout[result.stdout.index("{\n") :])
    assert summary["experiment"] == experiment and summary["synthetic_data"] is True
    assert summary["epochs"][0]["tracked_peak_mib"] > 0


def test_an_epoch_row_holds_every_field_of_its_record():
    """``History.as_rows`` casts ``asdict(record)`` to ``EpochRow``: the two must keep one set of
    fields, in one order, or the typed rows lie."""
    record = loop.EpochRecord(1, 50.0, 0.7, 60.0, 0.6, 2.0, 100.0, tracked_peak_mib=12.5)
    (row,) = loop.History("run", [record]).as_rows()
    assert list(row) == list(loop.EpochRow.__annotations__)
    assert row["tracked_peak_mib"] == 12.5 and row["nvml_used_mib"] is None
