"""tutorial_utils.articles.data: real file formats from the generators, the articles' loading, fast failures."""

from __future__ import annotations

import pickle
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torchvision import transforms

from tutorial_utils.articles import data
from tutorial_utils.articles.data import fetching  # patched where fetch_real_data looks names up
from tutorial_utils.articles.profiles import get_profile
from tutorial_utils.network import reachable


@pytest.fixture
def dogcat_root(tmp_path: Path) -> Path:
    return data.make_synthetic_dogcat(tmp_path / "dogcat", n_train=8, n_test=4, image_size=32)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetching, "reachable", lambda host, *args, **kwargs: False)


def jpeg_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.jpg"))}


# --------------------------------------------------------------------------- data root


def test_data_root_is_project_data_folder_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    project = Path(data.__file__).resolve().parents[3]  # tutorial_utils/articles/data/
    assert data.data_root() == project / "data"


def test_data_root_honours_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path / "elsewhere"))
    assert data.data_root() == tmp_path / "elsewhere"


# --------------------------------------------------------------------------- dog-cat


def test_synthetic_dogcat_writes_real_jpegs_in_imagefolder_layout(dogcat_root: Path) -> None:
    for split, count in (("train", 8), ("test", 4)):
        for class_name in ("cats", "dogs"):
            files = sorted((dogcat_root / split / class_name).iterdir())
            assert len(files) == count // 2
            for path in files:
                assert path.suffix == ".jpg"
                with Image.open(path) as image:
                    assert image.format == "JPEG"
                    assert image.size == (32, 32)
                    assert image.mode == "RGB"


def test_dogcat_datasets_yield_normalised_tensors_and_class_indices(dogcat_root: Path) -> None:
    train, val = data.dogcat_datasets(dogcat_root, image_size=24)
    assert train.class_to_idx == {"cats": 0, "dogs": 1}
    assert val.class_to_idx == {"cats": 0, "dogs": 1}
    assert (len(train), len(val)) == (8, 4)
    image, label = train[0]
    assert image.shape == (3, 24, 24) and image.dtype == torch.float32
    assert label in (0, 1)
    assert image.min() < 0  # normalised with the ImageNet mean/std, not left in [0, 1]
    assert val[0][0].shape == (3, 24, 24)


def test_dogcat_transforms_are_the_articles(dogcat_root: Path) -> None:
    train, val = data.dogcat_datasets(dogcat_root, image_size=40)
    rotate, flip, crop, to_tensor, normalize = train.transform.transforms
    assert isinstance(rotate, transforms.RandomRotation) and list(rotate.degrees) == [-30.0, 30.0]
    assert isinstance(flip, transforms.RandomHorizontalFlip) and flip.p == 0.5
    assert isinstance(crop, transforms.RandomResizedCrop)
    assert tuple(crop.size) == (40, 40)
    assert crop.scale == (0.96, 1.0) and crop.ratio == (0.95, 1.05)
    assert isinstance(to_tensor, transforms.ToTensor)
    assert normalize.mean == [0.485, 0.456, 0.406] and normalize.std == [0.229, 0.224, 0.225]
    resize, val_to_tensor, val_normalize = val.transform.transforms
    assert isinstance(resize, transforms.Resize) and list(resize.size) == [40, 40]
    assert isinstance(val_to_tensor, transforms.ToTensor)
    assert (val_normalize.mean, val_normalize.std) == (normalize.mean, normalize.std)


def test_dogcat_loaders_use_article_defaults(dogcat_root: Path) -> None:
    train_loader, val_loader = data.dogcat_loaders(dogcat_root, image_size=32, num_workers=0)
    assert train_loader.batch_size == val_loader.batch_size == 64
    assert isinstance(train_loader.sampler, torch.utils.data.RandomSampler)
    assert isinstance(val_loader.sampler, torch.utils.data.RandomSampler)
    images, labels = next(iter(train_loader))
    assert images.shape == (8, 3, 32, 32) and labels.dtype == torch.int64


def test_image_subset_is_a_seeded_sample_of_both_classes(tmp_path: Path) -> None:
    root = data.make_synthetic_dogcat(tmp_path / "dogcat", n_train=40, n_test=4, image_size=16)
    train, _ = data.dogcat_datasets(root, image_size=16)  # sorted by class: 20 cats, then 20 dogs
    first = data.image_subset(train, 10)
    again = data.image_subset(train, 10)
    other_seed = data.image_subset(train, 10, seed=1)
    assert isinstance(first, type(train)) and len(first) == 10 and first.classes == train.classes
    assert first.samples == again.samples != other_seed.samples
    assert set(first.targets) == {0, 1}  # not the first 10 files, which are all cats
    assert first.targets == [target for _, target in first.samples]
    assert len(train) == 40  # the full dataset is untouched
    assert data.image_subset(train, 100) is train
    with pytest.raises(ValueError, match="at least 1 image"):
        data.image_subset(train, 0)


def test_dogcat_loaders_keep_the_requested_number_of_images(dogcat_root: Path) -> None:
    train_loader, val_loader = data.dogcat_loaders(
        dogcat_root, 32, batch_size=4, num_workers=0, train_images=6, test_images=2
    )
    assert len(train_loader.dataset) == 6 and len(val_loader.dataset) == 2
    assert sum(len(labels) for _, labels in train_loader) == 6


def test_synthetic_dogcat_is_deterministic_per_seed(tmp_path: Path) -> None:
    first = data.make_synthetic_dogcat(tmp_path / "a", 4, 2, 32, seed=3)
    again = data.make_synthetic_dogcat(tmp_path / "b", 4, 2, 32, seed=3)
    other = data.make_synthetic_dogcat(tmp_path / "c", 4, 2, 32, seed=4)
    assert jpeg_bytes(first) == jpeg_bytes(again)
    assert jpeg_bytes(first).keys() == jpeg_bytes(other).keys()
    assert jpeg_bytes(first) != jpeg_bytes(other)


def test_synthetic_dogcat_reuses_a_complete_set_and_rebuilds_on_new_parameters(
    tmp_path: Path,
) -> None:
    root = data.make_synthetic_dogcat(tmp_path / "set", 4, 2, 32)
    marker = root / "train" / "cats" / "cat.0.jpg"
    written_at = marker.stat().st_mtime_ns
    data.make_synthetic_dogcat(root, 4, 2, 32)
    assert marker.stat().st_mtime_ns == written_at
    data.make_synthetic_dogcat(root, 6, 2, 16)
    assert len(list((root / "train").rglob("*.jpg"))) == 6
    with Image.open(root / "train" / "cats" / "cat.0.jpg") as image:
        assert image.size == (16, 16)


def test_synthetic_dogcat_refuses_to_overwrite_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not generated here"):
        data.make_synthetic_dogcat(tmp_path / "mine", 4, 2, 32)


def test_corrupt_images_are_skipped_with_one_counting_warning(dogcat_root: Path) -> None:
    truncated = dogcat_root / "train" / "cats" / "cat.0.jpg"
    truncated.write_bytes(truncated.read_bytes()[:200])
    (dogcat_root / "test" / "dogs" / "dog.999.jpg").write_bytes(b"not an image at all")
    (dogcat_root / "train" / "dogs" / "empty.jpeg").write_bytes(b"")
    (dogcat_root / "train" / "dogs" / "README.txt").write_text("not an image file: ignored quietly")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train, val = data.dogcat_datasets(dogcat_root, image_size=32)
    messages = [str(w.message) for w in caught if "unreadable" in str(w.message)]
    assert len(messages) == 1
    assert "skipped 3 unreadable image(s)" in messages[0]
    assert (len(train), len(val)) == (7, 4)
    with pytest.warns(UserWarning, match="skipped 3"):
        train_loader, val_loader = data.dogcat_loaders(dogcat_root, 32, batch_size=4, num_workers=0)
    assert sum(len(labels) for _, labels in train_loader) == 7
    assert sum(len(labels) for _, labels in val_loader) == 4


def test_missing_dogcat_names_download_and_synthetic_fallback(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        data.dogcat_datasets(tmp_path / "nowhere")
    message = str(error.value)
    assert "download_dogcat()" in message and "make_synthetic_dogcat" in message
    assert "--data synthetic" in message and "\n" not in message


def test_download_dogcat_fails_fast_offline(offline: None, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionError) as error:
        data.download_dogcat(tmp_path / "clone")
    assert time.monotonic() - started < 5
    assert "synthetic" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "clone").exists()


def test_download_dogcat_returns_present_dataset_without_network(
    offline: None, tmp_path: Path
) -> None:
    data.make_synthetic_dogcat(tmp_path / "clone" / "data", 2, 2, 16)
    assert data.download_dogcat(tmp_path / "clone") == tmp_path / "clone" / "data"


def test_real_connectivity_check_answers_within_seconds() -> None:
    started = time.monotonic()
    answer = reachable("github.com", timeout_s=2.0)
    assert isinstance(answer, bool)
    assert time.monotonic() - started < 4


def test_ensure_dogcat_generates_profile_sized_set_when_real_data_absent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    profile = get_profile("ci")
    root, synthetic = data.ensure_dogcat(profile)
    assert synthetic and root == tmp_path / "synthetic-dogcat-ci-32px"
    assert len(list((root / "train").rglob("*.jpg"))) == profile.dogcat_train_images
    assert len(list((root / "test").rglob("*.jpg"))) == profile.dogcat_test_images
    with Image.open(next((root / "test").rglob("*.jpg"))) as image:
        assert image.size == (profile.image_size, profile.image_size)
    assert "SYNTHETIC" in data.synthetic_banner("dog-cat")


def test_ensure_dogcat_prefers_the_real_dataset(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    real = tmp_path / "dog-cat-full-dataset" / "data"
    for split in ("train", "test"):
        for class_name in ("cats", "dogs"):
            (real / split / class_name).mkdir(parents=True)
            Image.new("RGB", (20, 20), "white").save(real / split / class_name / "x.jpg")
    assert data.ensure_dogcat(get_profile("cpu")) == (real, False)
    root, synthetic = data.ensure_dogcat(get_profile("ci"))  # ci stays tiny and generated
    assert synthetic and root != real


def test_tiny_cnn_learns_synthetic_dogcat_above_chance(tmp_path: Path) -> None:
    root = data.make_synthetic_dogcat(tmp_path / "learn", n_train=96, n_test=48, image_size=32)
    torch.manual_seed(0)
    train_loader, val_loader = data.dogcat_loaders(root, 32, batch_size=16, num_workers=0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 2),
    )
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(3):  # 18 steps
        for images, labels in train_loader:
            loss = nn.functional.cross_entropy(net(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        correct = sum((net(x).argmax(1) == y).sum().item() for x, y in val_loader)
    assert correct / len(val_loader.dataset) >= 0.8


# --------------------------------------------------------------------------- CIFAR-10


def test_synthetic_cifar_has_official_names_and_keys(tmp_path: Path) -> None:
    root = data.make_synthetic_cifar10(tmp_path, n_train=23, n_test=7)
    folder = root / "cifar-10-batches-py"
    expected = {f"data_batch_{i}" for i in range(1, 6)} | {"test_batch", "batches.meta"}
    assert expected <= {p.name for p in folder.iterdir()}
    with open(folder / "data_batch_1", "rb") as handle:
        assert handle.read(2) == b"\x80\x02"  # pickle protocol 2
    sizes = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(folder / name, "rb") as handle:
            batch = pickle.load(handle, encoding="bytes")
        assert set(batch) == {b"batch_label", b"labels", b"data", b"filenames"}
        assert batch[b"data"].dtype == np.uint8 and batch[b"data"].shape[1] == 3072
        assert all(isinstance(label, int) for label in batch[b"labels"])
        sizes.append(len(batch[b"labels"]))
    assert sizes == [5, 5, 5, 4, 4, 7]
    with open(folder / "batches.meta", "rb") as handle:
        meta = pickle.load(handle, encoding="bytes")
    assert meta[b"label_names"][0] == b"airplane" and len(meta[b"label_names"]) == 10
    assert data.cifar10_label_names(root)[9] == "truck"


def test_synthetic_cifar_loads_like_python2_files_in_torchvisions_reader(tmp_path: Path) -> None:
    """torchvision reads the official files with encoding="latin1" and expects str keys."""
    root = data.make_synthetic_cifar10(tmp_path, n_train=10, n_test=3)
    with open(root / "cifar-10-batches-py" / "test_batch", "rb") as handle:
        batch = pickle.load(handle, encoding="latin1")
    with open(root / "cifar-10-batches-py" / "batches.meta", "rb") as handle:
        meta = pickle.load(handle, encoding="latin1")
    images, labels = data.load_cifar10(root, train=False)
    assert batch["labels"] == labels.tolist()
    assert np.array_equal(batch["data"].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), images)
    assert meta["label_names"][3] == "cat"


def test_load_cifar10_round_trips_synthetic_files(tmp_path: Path) -> None:
    root = data.make_synthetic_cifar10(tmp_path, n_train=40, n_test=20, seed=1)
    train_x, train_y = data.load_cifar10(root, train=True)
    test_x, test_y = data.load_cifar10(root, train=False)
    assert train_x.shape == (40, 32, 32, 3) and train_x.dtype == np.uint8
    assert test_x.shape == (20, 32, 32, 3) and test_y.dtype == np.int64
    assert np.bincount(train_y, minlength=10).tolist() == [4] * 10
    with open(root / "cifar-10-batches-py" / "data_batch_1", "rb") as handle:
        first = pickle.load(handle, encoding="bytes")
    rows = first[b"data"]
    # channel-major rows: the first 1024 values are the red plane of image 0
    assert np.array_equal(rows[0, :1024].reshape(32, 32), train_x[0, :, :, 0])
    assert np.array_equal(rows[0, 2048:].reshape(32, 32), train_x[0, :, :, 2])


def test_synthetic_cifar_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = data.load_cifar10(data.make_synthetic_cifar10(tmp_path / "a", 10, 5, seed=7))
    b = data.load_cifar10(data.make_synthetic_cifar10(tmp_path / "b", 10, 5, seed=7))
    c = data.load_cifar10(data.make_synthetic_cifar10(tmp_path / "c", 10, 5, seed=8))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    assert (tmp_path / "a" / "cifar-10-batches-py" / "data_batch_3").read_bytes() == (
        tmp_path / "b" / "cifar-10-batches-py" / "data_batch_3"
    ).read_bytes()


def test_synthetic_cifar_classes_are_separable(tmp_path: Path) -> None:
    """A nearest-class-mean classifier on raw pixels must beat chance by far."""
    root = data.make_synthetic_cifar10(tmp_path, n_train=500, n_test=200)
    train_x, train_y = data.load_cifar10(root)
    test_x, test_y = data.load_cifar10(root, train=False)
    means = np.stack([train_x[train_y == k].reshape(-1, 3072).mean(0) for k in range(10)])
    distances = ((test_x.reshape(-1, 1, 3072).astype(np.float32) - means) ** 2).sum(-1)
    assert (distances.argmin(1) == test_y).mean() > 0.5


def test_missing_cifar_names_download_and_synthetic_fallback(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as error:
        data.load_cifar10(tmp_path)
    message = str(error.value)
    assert "download_cifar10()" in message and "make_synthetic_cifar10" in message
    assert "\n" not in message


def test_download_cifar10_fails_fast_offline(offline: None, tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="synthetic|generated"):
        data.download_cifar10(tmp_path)
    assert time.monotonic() - started < 5


def test_ensure_cifar10_sizes_from_profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    profile = get_profile("ci")
    root, synthetic = data.ensure_cifar10(profile)
    assert synthetic and root == tmp_path / "synthetic-cifar10-ci"
    assert len(data.load_cifar10(root)[1]) == profile.cifar_train_samples
    assert len(data.load_cifar10(root, train=False)[1]) == profile.cifar_test_samples


# --------------------------------------------------------------------------- the fetch cell


def _real_dogcat(root: Path) -> None:
    for split in ("train", "test"):
        for class_name in ("cats", "dogs"):
            (root / split / class_name).mkdir(parents=True)
            Image.new("RGB", (20, 20), "white").save(root / split / class_name / "x.jpg")


def test_fetch_real_data_offline_says_so_in_one_line_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, offline: None, tmp_path: Path
) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    for dataset, host in (("dog-cat", "github.com"), ("CIFAR-10", data.CIFAR_HOST)):
        started = time.monotonic()
        line = data.fetch_real_data(dataset, get_profile("cpu"))
        assert time.monotonic() - started < 5
        assert line.startswith(f"offline ({host} unreachable)") and "stand-in" in line
        assert "\n" not in line
    assert list(tmp_path.iterdir()) == []


def test_fetch_real_data_downloads_only_when_asked_and_needed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(fetching, "reachable", lambda host, *args, **kwargs: True)
    clones: list[str] = []

    def fake_clone() -> Path:
        clones.append("dog-cat")
        _real_dogcat(data.default_dogcat_root())
        return data.default_dogcat_root()

    monkeypatch.setattr(fetching, "download_dogcat", fake_clone)
    cpu = get_profile("cpu")
    assert "nothing fetched" in data.fetch_real_data("dog-cat", get_profile("ci"))
    assert "set FETCH_REAL_DATA = True" in data.fetch_real_data("dog-cat", cpu, fetch=False)
    assert clones == []
    assert data.fetch_real_data("dog-cat", cpu) == (
        f"fetched the real dog-cat into {data.default_dogcat_root()}"
    )
    assert data.ensure_dogcat(cpu) == (data.default_dogcat_root(), False)
    assert "already in" in data.fetch_real_data("dog-cat", cpu)
    assert clones == ["dog-cat"]


def test_fetch_real_data_reports_a_failed_download_and_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(fetching, "reachable", lambda host, *args, **kwargs: True)

    def failing_download(root=None):
        raise RuntimeError("connection reset")

    monkeypatch.setattr(fetching, "download_cifar10", failing_download)
    line = data.fetch_real_data("CIFAR-10", get_profile("gpu"))
    assert line == (
        "fetching the real CIFAR-10 failed (connection reset); going on with the generated stand-in"
    )
    assert data.ensure_cifar10(get_profile("ci"))[1]  # the stand-in is still there to use
    with pytest.raises(ValueError, match="one of dog-cat, CIFAR-10"):
        data.fetch_real_data("ImageNet")


def test_a_generated_set_in_the_real_folder_does_not_count_as_real(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    data.make_synthetic_cifar10(tmp_path, n_train=20, n_test=10)
    data.make_synthetic_dogcat(data.default_dogcat_root(), 2, 2, 16)
    assert not data.real_cifar10_present() and not data.real_dogcat_present()
    assert data.ensure_cifar10(get_profile("cpu"))[1] and data.ensure_dogcat(get_profile("cpu"))[1]


# --------------------------------------------------------------------------- cifar_batches


def test_cifar_batches_scale_upsample_and_count() -> None:
    images = np.random.default_rng(0).integers(0, 256, (10, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(10)
    batches = data.cifar_batches(images, labels, batch_size=4, image_size=48)
    assert len(batches) == 3 and len(batches.dataset) == batches.num_samples == 10
    seen = list(batches)
    assert [len(y) for _, y in seen] == [4, 4, 2]
    x, y = seen[0]
    assert x.shape == (4, 3, 48, 48) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert 0.0 <= x.min() and x.max() <= 1.0
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(images[:4]).permute(0, 3, 1, 2).float() / 255.0,
        (48, 48),
        mode="bilinear",
    )
    assert torch.equal(x, expected)
    assert y.tolist() == [0, 1, 2, 3]


def test_cifar_batches_keep_32px_untouched() -> None:
    images = np.random.default_rng(1).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    x, _ = next(iter(data.cifar_batches(images, np.zeros(3), batch_size=3, image_size=32)))
    assert torch.equal(x * 255.0, torch.from_numpy(images).permute(0, 3, 1, 2).float())


def test_cifar_batches_shuffle_each_pass_reproducibly() -> None:
    images = np.zeros((20, 32, 32, 3), dtype=np.uint8)
    labels = np.arange(20)

    def orders(seed: int) -> list[list[int]]:
        batches = data.cifar_batches(images, labels, 20, 32, shuffle=True, generator=seed)
        return [next(iter(batches))[1].tolist() for _ in range(2)]

    first_pass, second_pass = orders(5)
    assert sorted(first_pass) == list(range(20)) and first_pass != second_pass
    assert orders(5) == [first_pass, second_pass]
    unshuffled = data.cifar_batches(images, labels, 20, 32)
    assert next(iter(unshuffled))[1].tolist() == list(range(20))


def test_cifar_batches_reject_wrong_arrays() -> None:
    with pytest.raises(ValueError, match="uint8"):
        data.cifar_batches(np.zeros((2, 32, 32, 3), np.float32), np.zeros(2), 1)
    with pytest.raises(ValueError, match="labels"):
        data.cifar_batches(np.zeros((2, 32, 32, 3), np.uint8), np.zeros(3), 1)
