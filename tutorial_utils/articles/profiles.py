"""One knob for how big every experiment is: ``TUTORIAL_PROFILE`` = ci | cpu | gpu | article.

The same notebook runs in seconds under nbval (``ci``), in minutes on a laptop (``cpu``), in
minutes on one consumer or Colab GPU at the articles' image sizes and batches (``gpu``), and at
the articles' full scale (``article``); every figure names the profile it came from.

``TUTORIAL_STEPS=N`` rehearses any profile at its own image sizes, batches and budgets with only
N steps per training epoch, 2 epochs and N evaluation batches, so the ``gpu`` and ``article``
paths can be run end to end on a CPU before a GPU is rented.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal, overload

__all__ = [
    "default_profile_name",
    "get_profile",
    "Profile",
    "PROFILE_ENV",
    "ProfileName",
    "PROFILES",
]

PROFILE_ENV = "TUTORIAL_PROFILE"
STEPS_ENV = "TUTORIAL_STEPS"
REHEARSAL_EPOCHS = 2

ProfileName = Literal["ci", "cpu", "gpu", "article"]  # smallest to largest


@dataclass(frozen=True)
class Profile:
    """Sizes of every experiment in one place."""

    name: ProfileName
    description: str
    image_size: int  # dog-cat / VGG16 input side, pixels
    batch_size: int  # dog-cat training batch
    epochs: int
    dogcat_train_images: int  # the generated set's size, or a seeded sample of the real set
    dogcat_test_images: int
    cifar_image_size: int  # NetA input side after upsampling
    cifar_train_samples: int | None  # None = the whole split
    cifar_test_samples: int | None
    cifar_batch_size: int
    sweep_batch_size: int  # batch for segment sweeps and benchmarks
    num_workers: int
    use_real_data: bool  # False: always the small generated sets, even where the real ones exist
    save_epoch_state: bool  # the latest epoch's state on disk, for resume (VGG16: 1024 MiB a run)
    steps_cap: int | None = None  # TUTORIAL_STEPS: every loop, evaluation and data set capped

    @overload
    def capped(self, count: int) -> int: ...

    @overload
    def capped(self, count: None) -> None: ...

    def capped(self, count: int | None) -> int | None:
        """``count`` steps or batches, at most ``steps_cap`` of them (None stays None: all)."""
        if self.steps_cap is None or count is None:
            return count
        return min(count, self.steps_cap)

    def with_steps_cap(self, steps: int) -> Profile:
        """This profile's sizes with ``steps`` steps per epoch, 2 epochs and ``steps`` eval batches."""
        if steps < 1:
            raise ValueError(
                f"{STEPS_ENV} must be a whole number of steps, at least 1; got {steps}"
            )
        dogcat = steps * self.batch_size
        cifar = steps * self.cifar_batch_size
        return replace(
            self,
            description=f"{self.description}; rehearsal: {steps} step(s) per epoch ({STEPS_ENV})",
            epochs=min(self.epochs, REHEARSAL_EPOCHS),
            dogcat_train_images=min(self.dogcat_train_images, dogcat),
            dogcat_test_images=min(self.dogcat_test_images, dogcat),
            cifar_train_samples=min(self.cifar_train_samples or cifar, cifar),
            cifar_test_samples=min(self.cifar_test_samples or cifar, cifar),
            steps_cap=steps,
        )


PROFILES: dict[str, Profile] = {  # keyed by ProfileName; looked up by any string
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
        sweep_batch_size=4,
        num_workers=0,
        use_real_data=False,
        save_epoch_state=False,
    ),
    "cpu": Profile(
        name="cpu",
        description="a learner without a GPU: about 3 minutes per notebook on 2 cores",
        image_size=48,  # a step's convolutions cost its pixels: 48 px keeps 02 within 3 minutes
        batch_size=8,  # VGG16 learns the generated set in about 40 steps at the article's lr
        epochs=2,
        dogcat_train_images=192,  # 24 steps an epoch
        dogcat_test_images=64,
        cifar_image_size=48,
        cifar_train_samples=512,  # 16 steps of 32 an epoch
        cifar_test_samples=128,
        cifar_batch_size=32,
        sweep_batch_size=8,
        num_workers=2,
        use_real_data=True,
        # VGG16's weights and SGD momentum are 1024 MiB per run: a laptop's two-epoch lesson
        # writes none (the notebook says so); gpu and article keep the latest epoch's
        save_epoch_state=False,
    ),
    # The articles' regime (224 px, batch 64 and 31, the 2.5 GB card) on a data subset sized for
    # a few minutes per notebook on a T4-class card. Estimate, not a measurement (no GPU has run
    # it): dry-run FLOPs per step (VGG16 224 px batch 64: 5.9 TFLOP; NetA 224 px batch 31:
    # 0.88 TFLOP) at about 4 TFLOPS sustained (half a T4's fp32 peak): VGG16 about 1.5 s a step,
    # 2 runs x 2 epochs x 10 steps plus evaluation about 2-3 min; NetA about 0.2 s a step,
    # 2 runs x 2 epochs x 50 steps plus 4 x 50 short-training steps about 2 min.
    "gpu": Profile(
        name="gpu",
        description="one consumer or Colab GPU: the articles' 224 px and batches on a data subset",
        image_size=224,
        batch_size=64,
        epochs=2,
        dogcat_train_images=640,
        dogcat_test_images=320,
        cifar_image_size=224,
        cifar_train_samples=1550,
        cifar_test_samples=620,
        cifar_batch_size=31,
        sweep_batch_size=32,
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
        sweep_batch_size=32,
        num_workers=2,
        use_real_data=True,
        save_epoch_state=True,
    ),
}


def default_profile_name() -> ProfileName:
    """``gpu`` where CUDA is available (``article`` is chosen by name), ``cpu`` elsewhere."""
    import torch  # here, not at the top: the command line parses its arguments before torch loads

    return "gpu" if torch.cuda.is_available() else "cpu"


def steps_from_environment() -> int | None:
    """``$TUTORIAL_STEPS`` as a step count, None where unset."""
    text = os.environ.get(STEPS_ENV, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(
            f"{STEPS_ENV}={text!r} is not a number: set it to a step count such as 2, or unset it"
        ) from None


def get_profile(name: str | None = None) -> Profile:
    """The profile named, else ``$TUTORIAL_PROFILE``, else the machine's default; capped by
    ``$TUTORIAL_STEPS`` where it is set."""
    chosen = name or os.environ.get(PROFILE_ENV) or default_profile_name()
    try:
        profile = PROFILES[chosen]
    except KeyError:
        valid = ", ".join(PROFILES)
        raise ValueError(
            f"unknown profile {chosen!r}: set {PROFILE_ENV} to one of {valid}"
        ) from None
    steps = steps_from_environment()
    return profile if steps is None else profile.with_steps_cap(steps)
