"""Image data: CIFAR-10/100, MNIST, Fashion-MNIST as uint8 tensors, plus augmentation; and captioned images: the
composed fashion-mnist-scenes sets (:mod:`~skiplab.data.scenes` and its variants), caption files in COCO's and
Karpathy's formats with the images or features they describe (:mod:`~skiplab.data.captions`), and the scenes
written in those formats (:mod:`~skiplab.data.scene_files`).

>>> from skiplab.data import load_image_dataset, augment_batch, normalise
>>> data = load_image_dataset("cifar10")              # ImageData: train_x (50000, 3, 32, 32) uint8, ...
>>> x = augment_batch(data.train_x[:128], generator)  # random crop (pad 4) + horizontal flip
>>> x = normalise(x, data.mean, data.std)             # float32, per-channel standardised
"""

from .augment import augment_batch, normalise
from .download import DownloadError, download
from .images import IMAGE_DATASETS, DatasetInfo, ImageData, channel_stats, default_dirs, load_image_dataset
from .safe_pickle import RestrictedUnpickler, safe_loads

__all__ = [
    "IMAGE_DATASETS",
    "DatasetInfo",
    "DownloadError",
    "ImageData",
    "RestrictedUnpickler",
    "augment_batch",
    "channel_stats",
    "default_dirs",
    "download",
    "load_image_dataset",
    "normalise",
    "safe_loads",
]
