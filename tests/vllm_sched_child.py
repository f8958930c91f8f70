"""The vLLM side of tests/test_schedule_oracle.py: runs in an interpreter with vLLM (KVPLAN_VLLM_PYTHON) and
imports nothing from kvplan.

``python vllm_sched_child.py SPEC.json OUT.jsonl``: SPEC is a list of engines, each {kwargs, mixes}; for each
engine ``LLM(**kwargs)`` starts once and every mix (a list of [prompt, output] lengths, an optional shared prefix)
is generated with ``ignore_eos`` so each request produces exactly its output length, from an empty prefix cache. The child only observes:
``Scheduler.schedule`` and ``Scheduler._preempt_request`` are wrapped to record, after every scheduling step, the
running and waiting queue lengths, the free blocks and the tokens scheduled, and every preemption (step, request).
One JSON line per mix is appended to OUT.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

os.environ.update({"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"})


def main(spec_path: str, out_path: str) -> int:
    engines = json.loads(open(spec_path).read())
    from vllm import LLM, SamplingParams
    from vllm.v1.core.sched import scheduler as sched_mod

    log: dict = {"steps": [], "preempted": []}
    orig_schedule = sched_mod.Scheduler.schedule
    orig_preempt = sched_mod.Scheduler._preempt_request

    def schedule(self, *args, **kwargs):
        out = orig_schedule(self, *args, **kwargs)
        log["steps"].append([len(self.running), len(self.waiting),
                             self.kv_cache_manager.block_pool.get_num_free_blocks(), out.total_num_scheduled_tokens])
        return out

    def preempt(self, request, *args, **kwargs):
        log["preempted"].append([len(log["steps"]), int(request.request_id.split("-")[0])])
        return orig_preempt(self, request, *args, **kwargs)

    sched_mod.Scheduler.schedule = schedule
    sched_mod.Scheduler._preempt_request = preempt
    for eng in engines:
        llm = LLM(**eng["kwargs"])
        core = llm.llm_engine.engine_core.engine_core
        sched = core.scheduler
        settings = {"num_gpu_blocks": sched.kv_cache_manager.block_pool.num_gpu_blocks,
                    "max_num_seqs": sched.scheduler_config.max_num_seqs,
                    "max_num_batched_tokens": sched.scheduler_config.max_num_batched_tokens,
                    "chunked_prefill": sched.scheduler_config.enable_chunked_prefill,
                    "prefix_caching": sched.cache_config.enable_prefix_caching,
                    "async_scheduling": bool(sched.scheduler_config.async_scheduling),
                    "block_size": sched.cache_config.block_size,
                    "max_in_flight_tokens": llm.llm_engine.vllm_config.max_in_flight_tokens,
                    # the KV cache groups in the coordinator's order: [spec class, block size, window or null]
                    "groups": [[type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size,
                                getattr(g.kv_cache_spec, "sliding_window", None)]
                               for g in sched.kv_cache_config.kv_cache_groups],
                    "mamba_cache_mode": sched.cache_config.mamba_cache_mode}
        for mix in eng["mixes"]:
            # an empty prefix cache per mix (the replay starts from one): blocks an earlier mix cached stay
            # hashed in the free queue, and mixes drawn from the same seed share their first tokens
            settings["prefix_cache_reset"] = bool(llm.reset_prefix_cache())
            log["steps"], log["preempted"] = [], []
            rng = random.Random(mix.get("seed", 0))
            prefix = [rng.randrange(1, 250) for _ in range(mix.get("shared_prefix", 0))]
            prompts, params = [], []
            for p, o in mix["requests"]:
                head = prefix[:p]
                prompts.append({"prompt_token_ids": head + [rng.randrange(1, 250) for _ in range(p - len(head))]})
                params.append(SamplingParams(max_tokens=o, ignore_eos=True, temperature=0))
            t0 = time.monotonic()
            outs = llm.generate(prompts, params, use_tqdm=False)
            base = min(int(x.request_id.split("-")[0]) for x in outs)  # LLM numbers requests across calls
            with open(out_path, "a") as f:
                f.write(json.dumps({"id": mix["id"], "seconds": round(time.monotonic() - t0, 2), **settings,
                                    "steps": log["steps"], "preempted": [[s, i - base] for s, i in log["preempted"]],
                                    "outputs": [len(x.outputs[0].token_ids) for x in outs]}) + "\n")
        del llm
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
