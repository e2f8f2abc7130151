"""Where the tutorial's data lives, how the articles load it, and how to make it offline.

The real datasets are used when present. Offline (CI, an air-gapped lab) the generators write the
SAME file formats -- JPEG files in the ImageFolder layout, CIFAR-10 pickle batches -- so the loading
code that runs on generated data is the code that runs on the real data.

One module per job: ``folders`` (where data lives, the sets' layouts), ``generated`` (the offline
stand-ins), ``dogcat`` (the first article's set), ``cifar`` (the second's) and ``fetching`` (the
real sets, where the internet is). The notebooks import every name from here.
"""

from __future__ import annotations

from tutorial_utils.articles.data.cifar import (
    CifarBatches,
    cifar10_label_names,
    cifar_batches,
    ensure_cifar10,
    load_cifar10,
)
from tutorial_utils.articles.data.dogcat import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    dogcat_datasets,
    dogcat_loaders,
    dogcat_missing_message,
    dogcat_train_transform,
    dogcat_val_transform,
    ensure_dogcat,
    image_is_readable,
    image_subset,
)
from tutorial_utils.articles.data.fetching import (
    CIFAR_HOST,
    DOGCAT_REPO_URL,
    REAL_DATASETS,
    download_cifar10,
    download_dogcat,
    fetch_real_data,
)
from tutorial_utils.articles.data.folders import (
    CIFAR_DIRNAME,
    CIFAR_FULL_SIZES,
    CIFAR_LABEL_NAMES,
    CIFAR_META_FILE,
    CIFAR_TEST_FILE,
    CIFAR_TRAIN_FILES,
    DATA_DIR_ENV,
    DOGCAT_CLASSES,
    DOGCAT_DIRNAME,
    MANIFEST_NAME,
    data_root,
    default_dogcat_root,
    real_cifar10_present,
    real_dogcat_present,
    synthetic_banner,
)
from tutorial_utils.articles.data.generated import (
    make_synthetic_cifar10,
    make_synthetic_dogcat,
    synthetic_cifar10,
    synthetic_dogcat,
)

__all__ = [
    "CIFAR_DIRNAME",
    "CIFAR_FULL_SIZES",
    "CIFAR_HOST",
    "CIFAR_LABEL_NAMES",
    "CIFAR_META_FILE",
    "CIFAR_TEST_FILE",
    "CIFAR_TRAIN_FILES",
    "DATA_DIR_ENV",
    "DOGCAT_CLASSES",
    "DOGCAT_DIRNAME",
    "DOGCAT_REPO_URL",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MANIFEST_NAME",
    "REAL_DATASETS",
    "CifarBatches",
    "cifar10_label_names",
    "cifar_batches",
    "data_root",
    "default_dogcat_root",
    "dogcat_datasets",
    "dogcat_loaders",
    "dogcat_missing_message",
    "dogcat_train_transform",
    "dogcat_val_transform",
    "download_cifar10",
    "download_dogcat",
    "ensure_cifar10",
    "ensure_dogcat",
    "fetch_real_data",
    "image_is_readable",
    "image_subset",
    "load_cifar10",
    "make_synthetic_cifar10",
    "make_synthetic_dogcat",
    "real_cifar10_present",
    "real_dogcat_present",
    "synthetic_banner",
    "synthetic_cifar10",
    "synthetic_dogcat",
]
