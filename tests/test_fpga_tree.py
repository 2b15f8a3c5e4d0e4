"""The fpga tree (issue 14): the RMM's words, bit for bit, and the SumTree protocol within the documented error.

Three independent views of one computation are held against each other:

* :class:`~hetero_replay.fpga.reference.ReferenceRmm`, the quantised NumPy
  reference, against a flat model of the protocol (a leaf array, prefix sums);
* the emulation (the HLS source compiled with g++, device ``"fpga:emu"``)
  against the reference: random command traces, word for word, and trees over
  both, bit for bit;
* the fpga tree against the float64 NumPy tree: exactly where the float64
  sums are exact (``find``, ``sample``), within the fixed-point error bound of
  ``hetero_replay/fpga/fixed_point.py`` where they are not (leaves, ``P(i)``,
  IS weights).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from hetero_replay import _native, registry
from hetero_replay.fpga import protocol as P
from hetero_replay.fpga.fixed_point import (
    FRAC_BITS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    SCALE,
    dequantize,
    largest_priority,
    quantize,
)
from hetero_replay.fpga.reference import (
    TRACE_MAGIC,
    ReferenceRmm,
    main,
    random_trace,
    read_trace,
    scale_draws,
)
from hetero_replay.placement import DeviceUnavailableError, Placement
from hetero_replay.trees import FANOUTS, make_tree
from hetero_replay.trees.fpga_tree import BITFILE_ENV, FpgaSumTree

#: Both ports a tree runs on without a board.
DEVICES = ["fpga:ref", "fpga:emu"]
#: One leaf's largest rounding error, absolute (half a step).
HALF_STEP = 2.0**-23


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def emulated(capacity: int, fanout: int = 16):
    from hetero_replay.fpga.emulator import EmulatedRmm

    return EmulatedRmm(capacity, fanout)


# -- the reference against a flat model of the protocol ---------------------------------------------


class FlatModel:
    """The protocol on a flat leaf list with Python ints: no tree at all."""

    def __init__(self, capacity: int) -> None:
        self.cap, self.leaves, self.max = capacity, [0] * capacity, P.INIT_MAX

    def lookup(self, m: int) -> int:
        acc = 0
        for i, q in enumerate(self.leaves):
            acc += q
            if acc > m:
                return (i << 32) | q
        raise AssertionError("mass beyond the total")

    def run(self, cmd: np.ndarray) -> list[int]:
        words = [int(w) for w in cmd]
        op, n, payload = words[0] >> 56, words[0] & P.NONE32, words[1:]
        out, err, total = [], False, sum(self.leaves)
        if op == P.OP_UPDATE:
            for w in payload:
                i, q = w >> 32, w & P.NONE32
                if i >= self.cap:
                    err = True
                    continue
                self.leaves[i], self.max = q, max(self.max, q)
        elif op == P.OP_INSERT:
            if n > self.cap or payload[0] >= self.cap:
                err = True
            else:
                for t in range(n):
                    self.leaves[(payload[0] + t) % self.cap] = self.max
        elif op in (P.OP_SAMPLE, P.OP_FIND):
            for w in payload:
                m = (w * total) >> 32 if op == P.OP_SAMPLE else w
                if m >= total:
                    out.append(P.NONE32 << 32)
                    err = True
                else:
                    out.append(self.lookup(m))
        elif op == P.OP_GET:
            for i in payload:
                err |= i >= self.cap
                out.append((i << 32) | (self.leaves[i] if i < self.cap else 0))
        elif op == P.OP_CLEAR:
            self.leaves, self.max = [0] * self.cap, P.INIT_MAX
        else:
            err = True
        total = sum(self.leaves)
        positive = [q for q in self.leaves if q]
        return out + [total | (err << 63), (min(positive, default=P.NONE32) << 32) | self.max]


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 300), fanout=st.sampled_from(FANOUTS), seed=st.integers(0, 2**32 - 1))
def test_reference_matches_a_flat_model(capacity, fanout, seed):
    """The reference's tree (levels, exact sums, min tree, descent) computes what a flat leaf list does."""
    from hetero_replay.fpga.reference import _command

    rng = np.random.default_rng(seed)
    rmm, flat = ReferenceRmm(capacity, fanout), FlatModel(capacity)
    for _ in range(40):
        cmd = _command(rng, rmm)
        assert [int(w) for w in rmm.run(cmd)] == flat.run(cmd)
    np.testing.assert_array_equal(rmm.leaves(), flat.leaves)


def test_scale_draws_is_the_96_bit_product():
    rng = np.random.default_rng(0)
    r = rng.integers(0, 2**32, 1000, dtype=np.uint64)
    r[:2] = [0, 2**32 - 1]
    for total in (1, 2**32 - 1, 2**32, 3 * 2**40 + 12345, 2**60 - 1, 2**63 - 1):
        expected = [(int(x) * total) >> 32 for x in r]
        assert [int(m) for m in scale_draws(r, total)] == expected


def test_reference_registers_and_truncated_commands():
    rmm = ReferenceRmm(100, 4)
    assert (rmm.read_register(P.REG_FRAC_BITS), rmm.read_register(P.REG_FANOUT)) == (FRAC_BITS, 4)
    assert rmm.read_register(P.REG_MAX) == P.INIT_MAX and rmm.read_register(P.REG_MIN) == P.NONE32
    rmm.run(P.pack_update([3, 99], [5, 2**32 - 1]))
    total = 5 + 2**32 - 1
    assert rmm.read_register(P.REG_TOTAL_LO) | rmm.read_register(P.REG_TOTAL_HI) << 32 == total
    assert (rmm.read_register(P.REG_MIN), rmm.read_register(P.REG_MAX)) == (5, 2**32 - 1)
    assert rmm.read_register(P.REG_STATUS) == 0
    cut = P.pack_update([1, 2], [7, 7])[:-1]
    with pytest.raises(ValueError, match="truncated command at word 2: UPDATE with count 2 needs 2"):
        rmm.run(np.concatenate([P.pack_get([1]), cut]))
    np.testing.assert_array_equal(rmm.leaves()[[1, 2, 3]], [0, 0, 5])  # nothing ran, not even the GET
    rmm.run(P.pack_get([100]))  # an index past the capacity: flagged, sticky until STATUS is read
    assert rmm.read_register(P.REG_STATUS) == 1 and rmm.read_register(P.REG_STATUS) == 0
    rmm.write_register(P.REG_CAPACITY, 7)
    assert (rmm.capacity, rmm.depth, rmm.read_register(P.REG_TOTAL_LO)) == (7, 2, 0)
    with pytest.raises(ValueError, match="not writable"):
        rmm.write_register(P.REG_MAX, 1)


def test_trace_file_round_trip(tmp_path):
    path = tmp_path / "trace.bin"
    assert main(["--out", str(path), "--ops", "300", "--capacity", "50", "--fanout", "4", "--seed", "3"]) == 0
    assert int(np.frombuffer(path.read_bytes()[:8], "<u8")[0]) == TRACE_MAGIC
    capacity, fanout, commands, responses = read_trace(path)
    assert (capacity, fanout) == (50, 4)
    np.testing.assert_array_equal(ReferenceRmm(50, 4).run(commands), responses)
    # the trace exercises every opcode, the error flag, and leaves in the top half of the 32-bit range
    ops = set()
    pos = 0
    while pos < len(commands):
        op, n = int(commands[pos]) >> 56, int(commands[pos]) & P.NONE32
        ops.add(op)
        pos += 1 + (n if op in (1, 3, 4, 5) else op == 2)
    assert set(P.OPCODES) <= ops and ops - set(P.OPCODES)


# -- the emulation against the reference, word for word ---------------------------------------------


@pytest.mark.parametrize("capacity, fanout", [(1, 2), (2, 2), (17, 4), (1000, 16), (4097, 64), (70_000, 8)])
def test_emulation_replays_random_traces_bit_for_bit(capacity, fanout):
    commands, responses = random_trace(np.random.default_rng(capacity), capacity, fanout, 400)
    rmm = emulated(capacity, fanout)
    np.testing.assert_array_equal(rmm.run(commands), responses)
    ref = ReferenceRmm(capacity, fanout)
    ref.run(commands)
    for name, offset in P.REGISTERS.items():
        assert rmm.read_register(offset) == ref.read_register(offset), name


def test_emulation_refuses_truncated_commands_and_bad_arguments():
    rmm = emulated(10, 4)
    rmm.run(P.pack_update([1], [9]))
    with pytest.raises(ValueError):
        rmm.run(P.pack_update([2, 3], [7, 7])[:-1])
    np.testing.assert_array_equal(P.unpack_entries(rmm.run(P.pack_get([1, 2]))[:2])[1], [9, 0])
    for capacity, fanout in [(0, 4), (10, 3), (P.MAX_LEAVES + 1, 16)]:
        with pytest.raises(ValueError):
            emulated(capacity, fanout)


# -- trees over both ports: bit for bit, and against the float64 tree ---------------------------------


def fpga_trees(capacity, fanout, dtype):
    return [FpgaSumTree(capacity, fanout, dtype, device=d) for d in DEVICES]


def assert_same_fpga_trees(ref, tree, seed):
    """Bit for bit: leaves, total, min, running max, find, sample indices and weights."""
    np.testing.assert_array_equal(tree.leaves_q(), ref.leaves_q())
    np.testing.assert_array_equal(tree.leaves(), ref.leaves())
    assert (tree.total(), tree.min(), tree.max_q) == (ref.total(), ref.min(), ref.max_q)
    if ref.total() > 0:
        mass = np.random.default_rng(seed).random(257) * ref.total()
        np.testing.assert_array_equal(tree.find(mass), ref.find(mass))
        for stratified in (True, False):
            i_ref, w_ref = ref.sample(97, np.random.default_rng(seed), 0.4, stratified)
            i_tree, w_tree = tree.sample(97, np.random.default_rng(seed), 0.4, stratified)
            np.testing.assert_array_equal(i_tree, i_ref)
            np.testing.assert_array_equal(w_tree, w_ref)


def assert_matches_float64_tree(tree, seed):
    """The float64 NumPy tree over the dequantised leaves: its sums are exact here, so find and sample agree."""
    q = tree.leaves_q()
    exact = make_tree("numpy", tree.capacity, tree.fanout, "float64")
    exact.load_leaves(dequantize(q))
    assert exact.total() == tree.total() == int(q.sum(dtype=np.uint64)) / SCALE
    positive = q[q > 0]
    assert tree.min() == (float(dequantize(positive.min(), tree.dtype)) if positive.size else np.inf)
    if not q.any():
        return
    mass = np.random.default_rng(seed).random(101) * tree.total()
    np.testing.assert_array_equal(tree.find(mass), exact.find(mass))
    total_q = int(q.sum(dtype=np.uint64))
    for stratified in (True, False):
        idx, _ = tree.sample(64, np.random.default_rng(seed), 0.0, stratified)
        u = np.random.default_rng(seed).integers(0, 2**32, 64, dtype=np.uint64)
        r = [(j * 2**32 + int(x)) // 64 if stratified else int(x) for j, x in enumerate(u)]
        masses = np.array([(x * total_q) >> 32 for x in r], np.float64) / SCALE
        np.testing.assert_array_equal(idx, exact.find(masses))


priority = st.one_of(
    st.just(0.0),
    st.floats(min_value=MIN_PRIORITY, max_value=MAX_PRIORITY),
    st.floats(min_value=1e-4, max_value=10.0),
)
operation = st.tuples(
    st.sampled_from(["update", "insert", "update_td"]),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=64),
    st.lists(priority, min_size=64, max_size=64),
)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 3000),
    fanout=st.sampled_from(FANOUTS),
    ops=st.lists(operation, min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_tree_matches_the_quantised_reference(dtype, capacity, fanout, ops, seed):
    ref, tree = fpga_trees(capacity, fanout, dtype)
    for kind, raw_idx, raw_val in ops:
        idx = np.asarray(raw_idx) % capacity
        if kind == "insert":  # new transitions: a run of slots at the running max (an INSERT)
            idx = (raw_idx[0] + np.arange(len(raw_idx))) % capacity
            if len(idx) > capacity:
                idx = idx[:capacity]
            val = np.full(len(idx), dequantize(ref.max_q, dtype))
        else:  # float32 rounds MAX_PRIORITY up to 1024, which no leaf holds: its max_leaf is lower
            val = np.minimum(raw_val[: len(idx)], ref.max_leaf)
        for t in (ref, tree):
            if kind == "update_td":
                t.update_td(idx, val, 0.6, 1e-6)
            else:
                t.update(idx, val)
        assert_same_fpga_trees(ref, tree, seed)
        assert_matches_float64_tree(tree, seed)
    assert tree.port.read_register(P.REG_STATUS) == 0  # the kernel never saw a bad command


def test_large_batches_and_a_deep_tree_match(device):
    rng = np.random.default_rng(0)
    n = 200_003
    ref, tree = FpgaSumTree(n, 16, "float64", device="fpga:ref"), FpgaSumTree(n, 16, "float64", device=device)
    for _ in range(3):
        idx = rng.integers(0, n, 5000)
        val = rng.random(5000) * rng.choice([0.0, 1.0, 1e3], 5000)
        ref.update(idx, val)
        tree.update(idx, val)
        assert_same_fpga_trees(ref, tree, 1)
    leaves = rng.random(n) * 100
    ref.load_leaves(leaves)
    tree.load_leaves(leaves)
    assert_same_fpga_trees(ref, tree, 2)
    assert_matches_float64_tree(tree, 3)


# -- numerics against the float64 formulas -----------------------------------------------------------


def per_priorities(rng, n, alpha=0.6, eps=1e-6):
    """PER priorities: ``(|td| + eps) ** alpha`` for td log-uniform on [1e-8, 1e4], and the floor ``eps ** alpha``."""
    td = np.exp(rng.uniform(np.log(1e-8), np.log(1e4), n))
    td[:3] = 0.0
    return (td + eps) ** alpha


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_leaves_total_and_p_within_the_rounding_bound(device, dtype):
    rng = np.random.default_rng(1)
    p = per_priorities(rng, 5000).astype(dtype).astype(np.float64)  # the tree rounds to its dtype first
    tree = FpgaSumTree(5000, 16, dtype, device=device)
    tree.update(np.arange(5000), p)
    exact_leaves = dequantize(tree.leaves_q())
    assert np.all(np.abs(exact_leaves - p) <= HALF_STEP)  # round to nearest: half a step
    if dtype == "float64":
        np.testing.assert_array_equal(tree.leaves(), exact_leaves)
    else:  # float32 rounds the exact leaf once more
        np.testing.assert_allclose(tree.leaves(), exact_leaves, rtol=2.0**-24, atol=0)
    assert abs(tree.total() - p.sum()) <= 5000 * HALF_STEP
    # P(i) = q_i / total_q against p_i / sum p: within e_i + e_total, e = 2**-23 / p
    e_i, e_total = HALF_STEP / p, HALF_STEP * 5000 / p.sum()
    prob = exact_leaves / exact_leaves.sum()
    rel = np.abs(prob / (p / p.sum()) - 1)
    assert np.all(rel <= (e_i + e_total) / (1 - e_total) + 1e-12)


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_is_weights_within_the_documented_error(device, beta):
    """``w = (p_min / p_i) ** beta`` (float64, the unquantised priorities) within
    ``beta * (2**-23 / p_min + 2**-23 / p_i)`` plus float32 rounding."""
    rng = np.random.default_rng(5)
    p = per_priorities(rng, 3000)
    tree = FpgaSumTree(4000, 16, "float64", device=device)
    tree.update(np.arange(3000), p)
    idx, w = tree.sample(4096, rng, beta)
    assert w.dtype == np.float32 and idx.dtype == np.int64
    expected = (p.min() / p[idx]) ** beta
    spread = HALF_STEP / p.min() + HALF_STEP / p[idx]
    bound = beta * spread
    bound = bound * (1 + 3 * spread) + 2.0**-24 * (1 + bound)  # second order, and the float32 result's rounding
    assert np.all(np.abs(w / expected - 1) <= bound)
    if beta == 0:
        assert np.all(w == 1)
    # the weights are the float64 formula over the quantised leaves, exactly
    q = tree.leaves_q()
    np.testing.assert_array_equal(w, ((q[q > 0].min() / q[idx].astype(np.float64)) ** beta).astype(np.float32))


@pytest.mark.parametrize("stratified", [False, True])
def test_sampling_distribution(device, stratified):
    """Counts over many draws follow q_i / total_q (chi-square), zeros never drawn."""
    rng = np.random.default_rng(42)
    p = rng.random(60) ** 3
    p[[3, 17, 41]] = 0.0
    tree = FpgaSumTree(60, 4, device=device)
    tree.update(np.arange(60), p)
    q = tree.leaves_q().astype(np.float64)
    counts = np.zeros(60)
    draws = np.random.default_rng(7)
    for _ in range(100):
        idx, _ = tree.sample(1000, draws, 0.0, stratified)
        counts += np.bincount(idx, minlength=60)
    assert counts[[3, 17, 41]].sum() == 0
    expected = q / q.sum() * counts.sum()
    keep = q > 0
    assert stats.chisquare(counts[keep], expected[keep]).pvalue > 1e-3


def test_stratified_draw_j_lies_in_slice_j(device):
    """Draw j of a stratified batch of B comes from a leaf whose interval meets [j T / B, (j + 1) T / B)."""
    rng = np.random.default_rng(3)
    tree = FpgaSumTree(500, device=device)
    tree.update(np.arange(500), rng.random(500) * 10)
    q = [int(x) for x in tree.leaves_q()]
    bounds = np.cumsum([0, *q], dtype=object)
    total = int(bounds[-1])
    for batch in (1, 7, 64, 1000):
        idx, _ = tree.sample(batch, rng, 0.0, True)
        for j, i in enumerate(idx):
            # (r_j * T) >> 32 with r_j in [j 2**32 / B - 1, (j + 1) 2**32 / B)
            assert bounds[i] * batch < (j + 1) * total
            assert bounds[i + 1] * batch > j * total - batch * (total // 2**32 + 2)


def test_find_at_the_edges(device):
    tree = FpgaSumTree(10, 2, "float64", device=device)
    tree.update([2, 5, 9], [0.5, MIN_PRIORITY, 3.0])
    total = tree.total()
    np.testing.assert_array_equal(tree.find([0.0, 0.5 - 1e-12, 0.5, np.nextafter(total, 0)]), [2, 2, 5, 9])
    with pytest.raises(ValueError, match="mass at position 1 is .*outside"):
        tree.find([0.0, total])
    with pytest.raises(ValueError, match="outside"):
        tree.find([-1e-9])


# -- the SumTree protocol --------------------------------------------------------------------------


def test_last_write_wins(device):
    tree = FpgaSumTree(100, device=device)
    tree.update([5, 7, 5, 5, 7], [1.0, 2.0, 3.0, 4.0, 0.5])
    np.testing.assert_array_equal(tree.get([5, 7]), [4.0, 0.5])
    assert tree.total() == 4.5


def test_min_ignores_zeros_and_tracks_removals(device):
    tree = FpgaSumTree(50, device=device)
    assert tree.min() == np.inf
    tree.update([1, 2, 3], [0.5, 0.25, 0.0])
    assert tree.min() == 0.25
    tree.update([2], [0.0])
    assert tree.min() == 0.5
    wide = FpgaSumTree(5, dtype="float64", device=device)
    wide.update([1], [MAX_PRIORITY])  # the largest leaf, 0xFFFFFFFF, is also the min field's "none"
    assert wide.min() == wide.total() == MAX_PRIORITY and wide.leaves_q()[1] == P.NONE32


def test_new_transitions_go_in_as_one_insert(device):
    """A run of slots (wrapping around) at the running max becomes INSERT; its leaves are UPDATE's."""

    class Recording(ReferenceRmm):
        def __init__(self, capacity, fanout):
            super().__init__(capacity, fanout)
            self.opcodes = []

        def run(self, commands):
            self.opcodes.append(int(commands[0]) >> 56)
            return super().run(commands)

    port = Recording(10, 4)
    tree = FpgaSumTree(10, 4, "float64", port=port)
    plain = FpgaSumTree(10, 4, "float64", device=device)
    for t in (tree, plain):
        t.update([8, 9, 0, 1], [1.0] * 4)  # the running max starts at 1.0
        t.update([3], [2.5])
        t.update([2, 3, 4], [2.5] * 3)
        t.update([6, 5], [2.5, 2.5])  # not a run in order: UPDATE
    assert port.opcodes == [P.OP_CLEAR, P.OP_INSERT, P.OP_UPDATE, P.OP_INSERT, P.OP_UPDATE]
    assert_same_fpga_trees(plain, tree, 0)


@pytest.mark.parametrize(
    "bad_val, position",
    [
        ([1.0, np.nan, 2.0], 1),
        ([np.inf, 1.0, 1.0], 0),
        ([1.0, 2.0, -0.5], 2),
        ([1.0, 1.0, -np.inf], 2),
        ([1.0, 1e-7, 1.0], 1),  # below one step
        ([1.0, 1.0, 1024.0], 2),  # above (2**32 - 1) / 2**22
        ([1e300, 1.0, 1.0], 0),
    ],
)
def test_bad_priorities_refused_atomically(device, bad_val, position):
    tree = FpgaSumTree(10, device=device)
    tree.update([0, 1, 2], [1.0, 2.0, 3.0])
    before = (tree.leaves_q(), tree.total(), tree.min(), tree.max_q)
    with pytest.raises(ValueError, match=f"position {position} .*FRAC_BITS = 22"):
        tree.update([4, 5, 6], bad_val)
    with pytest.raises(ValueError, match=f"position {position}"):
        tree.load_leaves(bad_val + [1.0] * 7)
    after = (tree.leaves_q(), tree.total(), tree.min(), tree.max_q)
    np.testing.assert_array_equal(after[0], before[0])
    assert after[1:] == before[1:] == (6.0, 1.0, 3 * 2**FRAC_BITS)
    assert tree.port.read_register(P.REG_STATUS) == 0


def test_representable_range_is_the_documented_one(device):
    for dtype in ("float32", "float64"):
        tree = FpgaSumTree(4, dtype=dtype, device=device)
        assert tree.max_leaf == largest_priority(dtype) <= MAX_PRIORITY
        tree.update([0, 1, 2], [MIN_PRIORITY, tree.max_leaf, 0.0])
        assert tree.min() == float(np.asarray(MIN_PRIORITY, dtype)) and tree.get([1])[0] == tree.max_leaf
        tree.load_leaves(tree.leaves())  # the leaves a tree returns load back unchanged
        np.testing.assert_array_equal(tree.get([0, 1, 2]), np.asarray([MIN_PRIORITY, tree.max_leaf, 0], dtype))
    assert largest_priority("float64") == MAX_PRIORITY == (2**32 - 1) / 2**22
    np.testing.assert_array_equal(quantize([0.0, MIN_PRIORITY, 1.0, MAX_PRIORITY]), [0, 1, 2**22, 2**32 - 1])
    with pytest.raises(ValueError, match=r"^td: the value at position 0 is -1.0, outside .* FRAC_BITS = 22"):
        quantize([-1.0], "td")


@pytest.mark.parametrize("bad_idx, position", [([0, 10, 1], 1), ([-1, 0, 1], 0), ([0, 1, 2**40], 2)])
def test_out_of_range_indices_refused_atomically(device, bad_idx, position):
    tree = FpgaSumTree(10, device=device)
    tree.update([0], [1.0])
    with pytest.raises(IndexError, match=f"position {position}"):
        tree.update(bad_idx, [5.0, 5.0, 5.0])
    with pytest.raises(IndexError, match=f"position {position}"):
        tree.update_td(bad_idx, [5.0, 5.0, 5.0], 0.6, 1e-6)
    assert tree.total() == 1.0 and tree.max_q == P.INIT_MAX
    with pytest.raises(IndexError):
        tree.get([3, 11])
    assert tree.port.read_register(P.REG_STATUS) == 0


def test_malformed_arguments(device):
    tree = FpgaSumTree(10, device=device)
    with pytest.raises(TypeError, match="integers"):
        tree.update([0.5, 1.0], [1.0, 1.0])
    with pytest.raises(TypeError, match="real numbers"):
        tree.update([0, 1], ["a", "b"])
    with pytest.raises(ValueError, match="2 indices but 3 priorities"):
        tree.update([0, 1], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="1-D"):
        tree.update([[0, 1]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="no priority mass"):
        tree.sample(4, np.random.default_rng(0), 0.4)
    with pytest.raises(ValueError, match="no priority mass"):
        tree.find([0.0])
    tree.update([0], [2.0])
    with pytest.raises(ValueError, match="batch_size"):
        tree.sample(0, np.random.default_rng(0), 0.4)
    with pytest.raises(ValueError, match="expected 10 leaves, got 3"):
        tree.load_leaves([1.0, 1.0, 1.0])
    assert tree.total() == 2.0 and tree.port.read_register(P.REG_STATUS) == 0


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(fanout=3), ValueError),
        (dict(fanout=128), ValueError),
        (dict(dtype="int32"), ValueError),
        (dict(capacity=0), ValueError),
        (dict(capacity=2**28 + 1), ValueError),
        (dict(device="cuda"), ValueError),
        (dict(device="fpga:x"), ValueError),
    ],
)
def test_bad_construction(kwargs, error):
    args = dict(capacity=10, fanout=16, dtype="float32", device="fpga:ref") | kwargs
    with pytest.raises(error):
        FpgaSumTree(**args)


def test_a_port_of_another_fanout_or_size():
    with pytest.raises(ValueError, match="has fanout 4, the tree asks for 16"):
        FpgaSumTree(10, 16, port=ReferenceRmm(10, 4))
    with pytest.raises(ValueError, match="exceeds the 64 leaves the RMM on 'fpga:ref' holds"):
        FpgaSumTree(100, 16, port=ReferenceRmm(10, 16, max_leaves=64))
    tree = FpgaSumTree(50, 16, port=ReferenceRmm(10, 16, max_leaves=64))  # the CAPACITY register sizes it
    assert tree.port.capacity == 50 and tree.port.read_register(P.REG_DEPTH) == 2


def test_pickle_keeps_leaves_and_the_running_max(device):
    tree = FpgaSumTree(33, 4, "float64", device=device)
    tree.update([1, 5, 32], [0.5, 200.0, 1.0])
    tree.update([5], [0.25])  # the running max stays at 200 (max ever written)
    clone = pickle.loads(pickle.dumps(tree))
    assert clone.device == tree.device and clone.max_q == tree.max_q == 200 * 2**FRAC_BITS
    assert_same_fpga_trees(tree, clone, 0)
    for t in (tree, clone):
        t.update([10, 11], [200.0, 200.0])  # an INSERT on both
    assert_same_fpga_trees(tree, clone, 1)
    assert clone.port.read_register(P.REG_INIT_MAX) == P.INIT_MAX


def test_update_td_matches_the_quantised_formula_and_respects_limit(device):
    tree = FpgaSumTree(50, dtype="float64", device=device)
    td = np.array([0.0, 0.5, 2.0, 7.5])
    assert tree.update_td([1, 2, 3, 2], td, 0.6, 1e-6) == pytest.approx(7.5 + 1e-6)
    p, _ = _native.td_priorities(td, 0.6, 1e-6, np.float64)
    np.testing.assert_array_equal(tree.leaves_q()[[1, 2, 3]], quantize(p[[0, 3, 2]]))
    np.testing.assert_allclose(tree.get([1, 2]), [1e-6**0.6, (7.5 + 1e-6) ** 0.6], atol=HALF_STEP)
    before = tree.leaves_q()
    with pytest.raises(IndexError, match=r"position 1 is 10, outside \[0, 10\)"):
        tree.update_td([3, 10], [1.0, 1.0], 0.6, 1e-6, limit=10)
    with pytest.raises(ValueError, match="TD error at position 0 is -1"):
        tree.update_td([3, 4], [-1.0, 1.0], 0.6, 1e-6)
    with pytest.raises(ValueError, match=r"TD error at position 1 is 1000000.0: its priority .* FRAC_BITS = 22"):
        tree.update_td([3, 4], [1.0, 1e6], 0.6, 1e-6)
    with pytest.raises(ValueError, match="TD error at position 0 is 0.0: its priority"):
        tree.update_td([3], [0.0], 1.0, 1e-8)  # eps ** alpha = 1e-8, below one step
    np.testing.assert_array_equal(tree.leaves_q(), before)


def test_no_drift_and_no_kernel_error_over_many_updates(device):
    """Integer sums: after 2e5 updates (and inserts and samples) the tree is exactly a fresh build of its leaves."""
    rng = np.random.default_rng(0)
    n = 20_000
    tree = FpgaSumTree(n, 16, "float64", device=device)
    for step in range(100):
        tree.update(rng.integers(0, n, 2048), rng.random(2048) * 10)
        if step % 10 == 0:
            tree.update((step * 97 + np.arange(300)) % n, np.full(300, dequantize(tree.max_q)))
            tree.sample(256, rng, 0.4)
    q = tree.leaves_q()
    fresh = FpgaSumTree(n, 16, "float64", device=device)
    fresh.load_leaves(tree.leaves())
    np.testing.assert_array_equal(fresh.leaves_q(), q)
    assert fresh.total() == tree.total() == int(q.sum(dtype=np.uint64)) / SCALE
    assert fresh.min() == tree.min()
    assert tree.port.read_register(P.REG_STATUS) == 0


# -- registration ------------------------------------------------------------------------------------


def test_registered_as_fpga_with_its_emulation(monkeypatch):
    monkeypatch.delenv(BITFILE_ENV, raising=False)
    spec = registry.backend_spec("fpga")
    assert spec.devices == ("fpga",) and spec.emulated_on == ("fpga:emu",) and spec.auto_rank is None
    assert "fixed-point" in spec.description
    usable, reason = registry.usable("fpga")
    assert not usable and BITFILE_ENV in reason and "fpga:emu" in reason  # no board here
    for device in (None, "fpga:emu", "FPGA:EMU"):
        tree = make_tree("fpga", 100, 4, "float64", device=device)
        assert isinstance(tree, FpgaSumTree) and tree.device == "fpga:emu"
    with pytest.raises(ImportError, match=BITFILE_ENV):
        make_tree("fpga", 10, device="fpga:0")
    with pytest.raises(ValueError, match="runs on a 'fpga' device; got device 'cpu'"):
        make_tree("fpga", 10, device="cpu")
    assert "fpga" not in [s.name for s in registry.ranked_backends("fpga:0")]  # "auto" never picks it
    with pytest.raises(DeviceUnavailableError, match="^sample: 'fpga:0' requested"):
        Placement(sample="fpga", update="fpga", tree="fpga")
    assert Placement(sample="fpga", update="fpga", tree="fpga", check=False).replay_kwargs()["tree"] == "fpga"


def test_emulated_on_takes_named_devices():
    assert registry._device_types(("fpga:emu", "cpu"), "emulated_on", allow_named=True) == ("fpga:emu", "cpu")
    for bad in ("fpga:", "fpga:0:emu", "FPGA:emu"):
        with pytest.raises(ValueError, match="a device name such as 'fpga:emu'"):
            registry._device_types((bad,), "emulated_on", allow_named=True)
    with pytest.raises(ValueError, match="a device type is"):
        registry._device_types(("fpga:emu",), "devices")


def test_error_benchmark_measures_within_its_bounds(tmp_path, capsys):
    """benchmarks/bench_fpga_error.py on a small tree: every measured error within the documented bound."""
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        import bench_fpga_error
    finally:
        sys.path.pop(0)
    assert bench_fpga_error.main(["--capacity", "3000", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "fpga-error.json").read_text())["results"]
    assert results["probability"]["within_bound"] and results["kernel_errors"] == 0 == results["zero_draws"]
    assert [w["beta"] for w in results["weights"]] == [0.4, 1.0]
    assert all(w["within_bound"] and w["max_rel_error_all_leaves"] > 0 for w in results["weights"])
    assert "| IS weight, beta = 1.0 |" in (tmp_path / "fpga-error.md").read_text()
