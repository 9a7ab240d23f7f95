"""fast/warm.py's estimate of the compile time left: the reference seconds of every job, scaled by how this machine
ran the finished ones."""

from tinyspec.fast.warm import jobs, time_left


def test_the_estimate_scales_the_reference_by_this_machines_pace():
    refs = [ref for _, _, ref in jobs()]
    whole = max(max(refs), sum(refs) / 2)  # two processes: the reference compile's wall time
    # a machine at twice the reference's seconds, 10 s in: twice the whole, less what has passed
    assert abs(time_left([(13.0, 6.5)], refs, 2, 10.0) - (2 * whole - 10.0)) < 1e-9
    assert time_left([(0.0, 0.5)], refs, 2, 1.0) is None  # nothing measurable finished yet: no figure
    assert time_left([(r, r) for r in refs], refs, 2, 1e3) == 0.0  # never below zero


def test_every_job_has_a_reference_time():
    assert all(isinstance(label, str) and callable(job[0]) and ref > 0 for label, job, ref in jobs())
