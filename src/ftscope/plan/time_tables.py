"""The time bounds' tables per compute signature (classify._time_bounds), read per fitting candidate: each
signature's seconds per sequence on every GPU type, and each candidate's bound from its signature's, its micro-batch
and its block's exposed communication, as numpy arrays over the candidates."""
from __future__ import annotations

from ..estimate.solvers import BATCH_CAP
from .pass_bounds import exposed_seconds_per_sequence


def read_bounds(np, per_seq, tables, lengths_of, singles, comm_at, comm_of, k_of, fit_sig, seq_of, n_seqs, rows,
                 g_of, batch_max, bases, block_effs, shortest, comms) -> None:
    """Each fitting candidate's seconds per sequence into `per_seq`, from its signature's (k_of; -1: none, it stays
    0): the larger of the table at its length and its GPU type's micro-batch seconds over its largest micro-batch,
    plus its block's exposed communication (computed here for the blocks some candidate reads)."""
    k = k_of[fit_sig]
    if (k >= 0).all():  # every signature bounded (the clock did not stop them): no selection to gather
        sel, block = slice(len(k)), rows  # seq_of may hold one more (micro-batch 1)
    else:
        sel = np.flatnonzero(k >= 0)
        k, block = k[sel], rows[sel]
    if not len(k):
        return
    gpu, n_gpus = g_of[block], len(singles[0])
    width = np.array([len(u) for u in lengths_of])  # lengths per signature
    at = k * n_gpus + gpu  # the candidate's GPU type's micro-batch seconds among every signature's
    if (width == 1).all():  # one length per signature (packed): the tables line up with those
        table = np.concatenate([t.ravel() for t in tables])[at]
    else:
        first_length = np.concatenate([[0], np.cumsum(width)[:-1]])
        # each candidate's length's place among its signature's: a search over (signature, length) keys, ascending
        keys = np.repeat(np.arange(len(width)), width) * n_seqs + np.concatenate(lengths_of)
        place = np.searchsorted(keys, k * n_seqs + seq_of[sel]) - first_length[k]
        table = np.concatenate([t.ravel() for t in tables])[n_gpus * first_length[k] + gpu * width[k] + place]
    single = np.concatenate(singles)[at]
    comm = np.array(comm_at)[k]
    need = np.zeros((len(comm_of), len(bases)), bool)
    need[comm, block] = True
    exposed = np.empty((len(comm_of), len(bases)))
    for c, mix in comm_of.values():
        exposed[c] = exposed_seconds_per_sequence(np, bases, block_effs, mix, shortest, comms,
                                                  np.flatnonzero(need[c]).tolist())
    per_seq[sel] = np.maximum(table, single / batch_max[sel]) + exposed[comm, block]


def distinct_batches(np, batch):
    """np.unique(batch, return_inverse=True) for micro-batch bounds, which are whole numbers in [1, BATCH_CAP]: a
    table of the values present instead of sorting every candidate's (seconds on a space of millions)."""
    whole = batch.astype(np.int64)
    if not (whole.size and (whole == batch).all() and whole.min() >= 1 and whole.max() <= BATCH_CAP):
        return np.unique(batch, return_inverse=True)
    present = np.zeros(BATCH_CAP + 1, bool)
    present[whole.ravel()] = True
    values = np.flatnonzero(present)
    position = np.cumsum(present) - 1  # the rank of each present value among them
    return values.astype(batch.dtype), position[whole]
