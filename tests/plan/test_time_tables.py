"""time_tables: the time bounds' tables per signature and their reading per candidate."""
from __future__ import annotations

import numpy as np

from ftscope.plan.time_tables import distinct_batches


def test_distinct_batches_are_what_np_unique_gives():
    """The table of whole micro-batches present equals np.unique's values and inverse; anything else goes to
    np.unique itself."""
    rng = np.random.default_rng(3)
    for batch in (np.floor(rng.uniform(1, 300, (40, 50))), np.array([[1.0, 65536.0, 7.0]]), np.array([[1.5, 2.0]])):
        values, which = distinct_batches(np, batch)
        ref_values, ref_which = np.unique(batch, return_inverse=True)
        assert values.tolist() == ref_values.tolist()
        assert which.reshape(batch.shape).tolist() == ref_which.reshape(batch.shape).tolist()
