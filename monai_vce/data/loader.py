"""MONAI's ``DataLoader`` for datalists that are read on first use (:class:`~monai_vce.utils.LazySequence`)."""

from __future__ import annotations

from monai.data import DataLoader as _MonaiDataLoader

from monai_vce.utils import LazySequence

__all__ = ["VCEDataLoader"]


class VCEDataLoader(_MonaiDataLoader):
    """``monai.data.DataLoader`` whose length is unknown until its dataset's datalist has been read.

    MONAI's engines ask ``len(data_loader)`` when they are built. Over a datalist that is read on first use (the
    bundle's configs build theirs with :class:`~monai_vce.utils.LazySequence`, so that parsing a config reads no
    data), that would read the data at parse time. Until the datalist is read, ``len`` raises ``TypeError``, as a
    loader over an iterable dataset does: the engine then learns the length when it runs (ignite reads it from the
    loader, or counts the first epoch). Once the datalist is read, ``len`` is the usual number of batches. The
    arguments are those of ``monai.data.DataLoader``.
    """

    def __len__(self) -> int:
        data = getattr(self.dataset, "data", None)
        if isinstance(data, LazySequence) and not data.computed:
            raise TypeError("the length of this loader is known once its datalist is read (when a workflow runs)")
        return super().__len__()
