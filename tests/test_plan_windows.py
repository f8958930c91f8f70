"""Sliding-window groups in the scheduler replay (kvplan/schedule_sim.py), each expectation worked out by hand from
vLLM 0.32's rules (single_type_kv_cache_manager.py SlidingWindowManager, kv_cache_manager.py allocate_slots,
kv_cache_coordinator.py HybridKVCacheCoordinator); tests/test_schedule_oracle.py checks the same replay against the
engine itself.

Block 32, window 128: a request that has computed c tokens holds none of the blocks wholly before c - 127
(get_num_skipped_tokens), i.e. (c - 127) // 32 of them are freed before it asks for more.
"""

from __future__ import annotations

from conftest import run_cli
from kvplan.schedule_sim import SchedulerSettings, SimRequest, paged_group, simulate, sliding_group

BLOCK, WINDOW = 32, 128


def _settings(num_blocks: int, groups, mbt: int = 4096, prefix: bool = False) -> SchedulerSettings:
    return SchedulerSettings(num_blocks, tuple(groups), 64, mbt, 1024, prefix)


def test_blocks_behind_the_window_are_freed_before_the_next_ask():
    """Prefill of 300 tokens takes ceil(300/32) = 10 blocks; at the next step (c = 300) (300 - 127) // 32 = 5 are
    freed first and the 301st token fits the 10th block: 5 held. Step k computes token 300 + k with c = 299 + k:
    at c = 319 (step 20) (319 - 127) // 32 = 6 are behind and token 320 fits the 10th block: 4 held; at c = 320 the
    11th block is taken: 5 held."""
    trace = simulate(_settings(41, [sliding_group(BLOCK, WINDOW, 4096)]), [SimRequest(300, 30)])
    held = [40 - s.free_blocks for s in trace.steps]
    assert held[:3] == [10, 5, 5]
    assert held[20] == 10 - (319 - 127) // 32 == 4 and held[21] == 11 - (320 - 127) // 32 == 5
    full = simulate(_settings(41, [paged_group(BLOCK)]), [SimRequest(300, 30)])
    assert [40 - s.free_blocks for s in full.steps][:2] == [10, 10]


def test_admission_asks_the_window_cap_not_the_prompt():
    """max_num_batched_tokens 512: the cap is ceil(min(127 + 512, 1024) / 32) + 1 = 21 blocks. A 1000-token prompt
    (32 blocks) is admitted into 21 free blocks and runs in chunks of 512 (16 blocks, then 16 more after 12 are
    freed behind c = 512); full attention would wait for 32 blocks forever."""
    group = sliding_group(BLOCK, WINDOW, 512)
    assert group.admission_cap(1024) == 21 and group.admission_blocks(1000, 1024) == 21
    assert group.admission_blocks(300, 1024) == 10
    trace = simulate(_settings(22, [group], mbt=512), [SimRequest(1000, 5)])
    assert not trace.truncated and not trace.preemptions
    assert [s.scheduled_tokens for s in trace.steps[:3]] == [512, 488, 1]
    assert trace.steps[0].free_blocks == 21 - 16 and trace.steps[1].free_blocks == 21 - 16 + 12 - 16
    stuck = simulate(_settings(22, [paged_group(BLOCK)], mbt=512), [SimRequest(1000, 5)], max_steps=50)
    assert stuck.truncated and not stuck.steps[0].running


def test_hybrid_prefix_hit_waits_for_the_windows_junction():
    """Full + sliding, a 256-token shared prefix. A (step 0) caches every full block but only the window blocks
    ending at its prompt's last boundary (blocks 8-11, own tokens). B (step 1): full attention hits 256 tokens,
    the window none below 256, so the hit is 0 and B's junction is 256: B caches window blocks 4-7. C (step 2): the
    window finds ceil(127/32) = 4 cached blocks ending at 256, so C computes 400 - 256 = 144 tokens."""
    groups = [paged_group(BLOCK), sliding_group(BLOCK, WINDOW, 4096)]
    reqs = [SimRequest(400, 10, 256, arrival_step=k) for k in range(3)]
    trace = simulate(_settings(200, groups, prefix=True), reqs)
    assert [s.scheduled_tokens for s in trace.steps[:3]] == [400, 1 + 400, 1 + 1 + 144]
    # full attention alone hits at once: B computes 144 too
    full = simulate(_settings(200, [paged_group(BLOCK)], prefix=True), reqs)
    assert [s.scheduled_tokens for s in full.steps[:3]] == [400, 1 + 144, 1 + 1 + 144]


def test_plan_says_what_it_replays_for_windows_and_states():
    out = run_cli("plan", "gemma-2-9b", "--gpu", "H100", "--prompt", "3000", "--output", "500", "--requests", "50",
                  "--burst", "--json").json()
    text = " ".join(out["assumptions"])
    assert "sliding-window groups replayed" in text and out["pool"]["prefix_caching"] is True
    assert "prefix caching replayed for windows" in text
    hybrid = run_cli("plan", "nemotron-3-nano", "--gpu", "H100", "--prompt", "1000", "--output", "100", "--requests", "20",
                     "--burst", "--json").json()
    text = " ".join(hybrid["assumptions"])
    assert hybrid["pool"]["prefix_caching"] is False and "prefix caching is not replayed" in text
    off = run_cli("plan", "nemotron-3-nano", "--gpu", "H100", "--prompt", "1000", "--output", "100", "--requests", "20",
                  "--burst", "--no-enable-prefix-caching", "--json").json()
    assert "mamba_cache_mode 'none'" in " ".join(off["assumptions"])


def test_a_later_copy_of_a_cached_block_is_found_once_the_first_is_evicted():
    """block_pool.py BlockHashToBlockMap keeps every block cached under a hash (no de-duplication) and a lookup
    returns the earliest still there: evicting the first copy leaves the second findable (a window's junction
    blocks are cached again by each request that misses them, so copies are common)."""
    from kvplan.schedule_sim import _Pool

    pool = _Pool(4)
    a, b = pool.take(2)
    pool.insert("h", a)
    pool.insert("h", b)
    assert pool.cached["h"] == a
    pool.release([a])  # cached: to the back of the free queue, behind block 3
    pool.take(2)  # block 3, then a (evicted)
    assert pool.cached["h"] == b and pool.hash_of[a] is None
    pool.release([b])
    pool.take(1)
    assert "h" not in pool.cached and not pool.copies


def test_plan_window_cap_counts_the_batches_in_flight():
    """gpt-oss-20b (window 128, block 16), max_num_batched_tokens 8192 on an H100: asynchronous scheduling keeps two
    batches in flight, ceil((127 + 16384) / 16) + 1 = 1,033 blocks; synchronous one, ceil((127 + 8192) / 16) + 1 = 521."""
    args = ("plan", "gpt-oss-20b", "--gpu", "H100", "--prompt", "300", "--output", "50", "--requests", "20", "--burst",
            "--max-num-batched-tokens", "8192", "--json")
    cap = [a for a in run_cli(*args).json()["assumptions"] if "admission asks at most" in a]
    assert len(cap) == 1 and "at most 1,033 blocks" in cap[0]
    sync = [a for a in run_cli(*args, "--no-async-scheduling").json()["assumptions"] if "admission asks at most" in a]
    assert len(sync) == 1 and "at most 521 blocks" in sync[0]
