"""One knob for how big every experiment is: ``TUTORIAL_PROFILE`` = ci | cpu | article.

The same notebook runs in seconds under nbval (``ci``), in minutes on a laptop (``cpu``) and at
the articles' scale on a GPU (``article``); every figure names the profile it came from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tutorial_utils.units import MB

PROFILE_ENV = "TUTORIAL_PROFILE"


@dataclass(frozen=True)
class Profile:
    """Sizes of every experiment in one place."""

    name: str
    description: str
    image_size: int  # dog-cat / VGG16 input side, pixels
    batch_size: int  # dog-cat training batch
    epochs: int
    dogcat_train_images: int  # generated images when the real dataset is absent
    dogcat_test_images: int
    cifar_image_size: int  # NetA input side after upsampling
    cifar_train_samples: int | None  # None = the whole split
    cifar_test_samples: int | None
    cifar_batch_size: int
    memory_budget_bytes: int  # the "small card" of the max-batch search
    sweep_batch_size: int  # batch for segment sweeps and benchmarks
    num_workers: int
    use_real_data: bool  # False: always the small generated sets, even where the real ones exist
    save_epoch_state: bool  # the latest epoch's state on disk, for resume (VGG16: about 1 GB)


PROFILES: dict[str, Profile] = {
    "ci": Profile(
        name="ci",
        description="tests and nbval: seconds per notebook on 2 CPU cores, tiny generated data",
        image_size=32,
        batch_size=8,
        epochs=1,
        dogcat_train_images=32,
        dogcat_test_images=16,
        cifar_image_size=32,
        cifar_train_samples=64,
        cifar_test_samples=32,
        cifar_batch_size=16,
        memory_budget_bytes=40 * MB,
        sweep_batch_size=4,
        num_workers=0,
        use_real_data=False,
        save_epoch_state=False,
    ),
    "cpu": Profile(
        name="cpu",
        description="a learner without a GPU: minutes per notebook",
        image_size=64,
        batch_size=16,
        epochs=2,
        dogcat_train_images=400,
        dogcat_test_images=100,
        cifar_image_size=64,
        cifar_train_samples=2000,
        cifar_test_samples=500,
        cifar_batch_size=32,
        memory_budget_bytes=256 * MB,
        sweep_batch_size=8,
        num_workers=2,
        use_real_data=True,
        save_epoch_state=True,
    ),
    "article": Profile(
        name="article",
        description="the articles' scale: 224 px, batch 64, 10 epochs, full datasets (a GPU)",
        image_size=224,
        batch_size=64,
        epochs=10,
        dogcat_train_images=20000,
        dogcat_test_images=5000,
        cifar_image_size=224,
        cifar_train_samples=None,
        cifar_test_samples=None,
        cifar_batch_size=31,
        memory_budget_bytes=int(2.5 * 2**30),
        sweep_batch_size=32,
        num_workers=2,
        use_real_data=True,
        save_epoch_state=True,
    ),
}


def default_profile_name() -> str:
    """``article`` where CUDA is available, ``cpu`` elsewhere."""
    import torch  # here, not at the top: the command line parses its arguments before torch loads

    return "article" if torch.cuda.is_available() else "cpu"


def get_profile(name: str | None = None) -> Profile:
    """The profile named, else ``$TUTORIAL_PROFILE``, else the default for this machine."""
    chosen = name or os.environ.get(PROFILE_ENV) or default_profile_name()
    try:
        return PROFILES[chosen]
    except KeyError:
        valid = ", ".join(PROFILES)
        raise ValueError(
            f"unknown profile {chosen!r}: set {PROFILE_ENV} to one of {valid}"
        ) from None
