"""Generates tests/corpus/bad/*.toml: one defect each, first line '# expect: <fragment of the one problem line>'."""
from pathlib import Path

HERE = Path(__file__).parent

BASE = '''description = "one request past the window"
tags = ["corpus"]

[model]
preset = "gpt-oss-mini"

[pool]
full_size = 64
swa_size = 32

[graphs]
modes = ["eager", "full"]
decode_buckets = [1, 2]

[timeline]
seed = 3
[[timeline.requests]]
rid = "a"
prompt_len = 10
output_len = 3

[run]
designs = ["translate"]

[expect.translate]
verdict = "match"
why = "re-translates every layer"
'''


def sub(old, new):
    assert old in BASE, old
    return BASE.replace(old, new, 1)


CASES = {
    # parsing
    "bom": ("line 1, column 1: the file starts with a UTF-8 byte-order mark", "\ufeff" + BASE),
    "not_utf8": ("line 2, column 19: not UTF-8 text: invalid continuation byte (byte 0xe9)", None),
    "invalid_toml": ("line 2, column 28: invalid TOML: Illegal character", "description = \"unterminated\n" + BASE.split("\n", 1)[1]),
    "deep_nesting": (f"line {BASE.count(chr(10)) + 2}, column 69: invalid TOML: arrays or inline tables nested too "
                     "deeply", BASE + "x = " + "[" * 3000 + "]" * 3000 + "\n"),
    "duplicate_key": ("invalid TOML: Cannot overwrite a value", sub('swa_size = 32\n', 'swa_size = 32\nswa_size = 33\n')),
    # top level
    "missing_description": ("description: missing required key", sub('description = "one request past the window"\n', "")),
    "empty_description": ("description: expected a non-empty string", sub('"one request past the window"', '"   "')),
    "unknown_top_key": ("comment: unknown key", "comment = 1\n" + BASE),
    "tags_not_array": ("tags: expected an array", sub('tags = ["corpus"]', 'tags = "corpus"')),
    "tag_not_printable": ("tags[0]: expected a non-empty printable string", sub('tags = ["corpus"]', 'tags = ["a\\u001b[31m"]')),
    # serving
    "serving_string": ("serving: expected a table, got string 'sglang'", 'serving = "sglang"\n' + BASE),
    "serving_unknown_stack": ("serving.stack: unknown serving stack 'sglnag' (did you mean 'sglang'?)",
                              BASE + '[serving]\nstack = "sglnag"\n'),
    "serving_unknown_key": ("serving.policy: unknown key; expected one of stack, free_order",
                            BASE + '[serving]\npolicy = "tight"\n'),
    "serving_free_order_twice": ("serving.free_order: given in [pool] too",
                                 sub('swa_size = 32\n', 'swa_size = 32\nfree_order = "fifo"\n')
                                 + '[serving]\nfree_order = "lifo"\n'),
    # model
    "missing_model": ("model: missing required table", sub('[model]\npreset = "gpt-oss-mini"\n', "")),
    "unknown_preset": ("model.preset: expected one of", sub('"gpt-oss-mini"', '"llama-mini"')),
    "model_unknown_field": ("model.windw: unknown key", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nwindw = 8\n')),
    "window_string": ("model.window: expected an integer, got string '8'", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nwindow = "8"\n')),
    "window_zero": ("model.window: expected an integer from 1 to 4096, got 0", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nwindow = 0\n')),
    "hidden_huge": ("model.hidden_size: expected an integer from 1 to 4096, got 4611686018427387904", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nhidden_size = 4611686018427387904\n')),
    "vocab_huge": ("model.vocab_size: expected an integer from 1 to 262144, got 1099511627776", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nvocab_size = 1099511627776\n')),
    "model_seed_65_bits": ("model.seed: expected an integer from 0 to 9223372036854775807", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nseed = 18446744073709551615\n')),
    "heads_not_multiple": ("model.num_heads: expected a multiple of num_kv_heads (2), got 3", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nnum_heads = 3\n')),
    "head_dim_odd": ("model.head_dim: expected an even number for RoPE, got 15", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nhead_dim = 15\n')),
    "layer_pattern_bad_entry": ("model.layer_pattern: expected entries 'swa' or 'full'", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nlayer_pattern = ["swa", "global"]\n')),
    "model_dtype": ("model.dtype: expected one of", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\ndtype = "float64"\n')),
    "model_too_big": ("model: the weights need", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nhidden_size = 4096\nvocab_size = 262144\n')),
    "rope_theta_nan": ("model.rope_theta: expected a finite number > 1", sub('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nrope_theta = nan\n')),
    # pool
    "pool_not_table": ("pool: expected a table, got integer 3", sub('[pool]\nfull_size = 64\nswa_size = 32\n', '').replace('[model]', 'pool = 3\n\n[model]')),
    "full_size_bool": ("pool.full_size: expected an integer, got boolean true", sub("full_size = 64", "full_size = true")),
    "swa_size_one": ("pool.swa_size: expected an integer from 2 to 1048576, got 1", sub("swa_size = 32", "swa_size = 1")),
    "kv_dtype": ("pool.kv_dtype: expected one of 'float32', 'bfloat16', 'float16', 'fp8_e4m3', got 'int4'", sub("swa_size = 32\n", 'swa_size = 32\nkv_dtype = "int4"\n')),
    "table_too_big": ("pool.max_running_requests: (max_running_requests + 1) x max_context_len must stay within", sub("swa_size = 32\n", "swa_size = 32\nmax_running_requests = 1000000\nmax_context_len = 4096\n")),
    "context_past_rope": ("pool.max_context_len: expected at most 4096 (the RoPE cache), got 5000", sub("swa_size = 32\n", "swa_size = 32\nmax_context_len = 5000\n")),
    "kv_cache_too_big": ("pool: the KV buffers need 2048 MiB", sub("full_size = 64\nswa_size = 32\n", "full_size = 1048576\nswa_size = 1048576\n").replace('preset = "gpt-oss-mini"\n', 'preset = "gpt-oss-mini"\nnum_kv_heads = 4\n')),
    "swa_pool_too_small": ("pool.swa_size: too small for the timeline", sub("swa_size = 32", "swa_size = 4")),
    # what a scenario makes a run allocate, each field within its own bounds
    "snapshots_too_big": ("pool: the diff rebuilds each step's pools 3 times (the subject's at the step and the step before, the reference's), 3 x 520 MiB",
                          sub("full_size = 64\nswa_size = 32\n", "full_size = 524288\nswa_size = 524288\n")
                          .replace("output_len = 3", "output_len = 20")),
    "forward_too_big": ("timeline: the forward of 4000 tokens at step 0 attends over 4096 page-table columns",
                        sub("full_size = 64\nswa_size = 32\n", "full_size = 8192\nswa_size = 8192\nmax_context_len = 4096\n")
                        .replace("prompt_len = 10", "prompt_len = 4000")),
    # eviction
    "prefix_cache_not_bool": ("eviction.prefix_cache: expected true or false, got string 'yes'", sub("[graphs]", '[eviction]\nprefix_cache = "yes"\n\n[graphs]')),
    # graphs
    "mode_typo": ("graphs.modes[1]: expected one of 'eager', 'full', 'piecewise', got 'fulll'", sub('modes = ["eager", "full"]', 'modes = ["eager", "fulll"]')),
    "duplicate_bucket": ("graphs.decode_buckets[1]: duplicate of decode_buckets[0] (2)", sub("decode_buckets = [1, 2]", "decode_buckets = [2, 2]")),
    "decode_graphs_too_big": ("graphs.decode_buckets: the decode graphs need 9650176 MiB (page tables of 1048576 rows "
                              "x 4096 columns", sub("decode_buckets = [1, 2]", "decode_buckets = [1048576]")
                              .replace("swa_size = 32\n", "swa_size = 32\nmax_context_len = 4096\n")),
    "prefill_capture_too_big": ("graphs.prefill_buckets: capturing the 65536-token bucket attends over 4096 columns",
                                sub('modes = ["eager", "full"]\ndecode_buckets = [1, 2]',
                                    'modes = ["eager", "piecewise"]\nprefill_buckets = [8, 65536]')
                                .replace("swa_size = 32\n", "swa_size = 32\nmax_context_len = 4096\n")),
    "bucket_zero": ("graphs.decode_buckets[0]: expected an integer from 1 to 1048576, got 0", sub("decode_buckets = [1, 2]", "decode_buckets = [0, 2]")),
    "capture_policy": ("graphs.capture: expected one of 'startup', 'on_demand', got 'lazy'", sub("decode_buckets = [1, 2]\n", 'decode_buckets = [1, 2]\ncapture = "lazy"\n')),
    "empty_modes": ("graphs.modes: expected at least one item", sub('modes = ["eager", "full"]', "modes = []")),
    # timeline
    "seed_65_bits": ("timeline.seed: expected an integer from 0 to 9223372036854775807, got 18446744073709551616", sub("seed = 3", "seed = 18446744073709551616")),
    "negative_seed": ("timeline.seed: expected an integer from 0 to", sub("seed = 3", "seed = -1")),
    "no_requests": ("timeline.requests: missing required key", BASE.split("[[timeline.requests]]")[0] + BASE.split('output_len = 3\n')[1]),
    "abort_before_arrive": ("timeline.requests[0].abort: must come after arrive (got 2 <= 2)", sub('rid = "a"\n', 'rid = "a"\narrive = 2\nabort = 2\n')),
    "request_too_long": ("timeline.requests[0]: needs 103 positions, pool.max_context_len is 64", sub("prompt_len = 10", "prompt_len = 100")),
    "rid_not_printable": ("timeline.requests[0].rid: expected a non-empty printable string", sub('rid = "a"', 'rid = "a\\u0007"')),
    "arrive_past_max_steps": ("timeline.requests[0].arrive: must come before timeline.max_steps (got 9 >= 5)", sub("seed = 3\n", "seed = 3\nmax_steps = 5\n").replace('rid = "a"\n', 'rid = "a"\narrive = 9\n')),
    "max_steps_too_small": ("timeline.max_steps: too small", sub("seed = 3\n", "seed = 3\nmax_steps = 2\n")),
    "duplicate_rid": ("timeline.requests[1].rid: duplicate rid 'a'", sub('output_len = 3\n', 'output_len = 3\n[[timeline.requests]]\nrid = "a"\nprompt_len = 2\n')),
    "prefix_of_unknown": ("timeline.requests[1].prefix_of: no request has rid 'x'", sub('output_len = 3\n', 'output_len = 3\n[[timeline.requests]]\nrid = "b"\narrive = 1\nprompt_len = 6\nprefix_of = "x"\nshared_len = 4\n')),
    "prefix_of_not_earlier": ("timeline.requests[1].prefix_of: requests[0] ('a') must arrive before this one (got 0 >= 0)", sub('output_len = 3\n', 'output_len = 3\n[[timeline.requests]]\nrid = "b"\nprompt_len = 6\nprefix_of = "a"\nshared_len = 4\n')),
    "shared_len_past_prompt": ("timeline.requests[1].shared_len: must not exceed prompt_len (got 8 > 6)", sub('output_len = 3\n', 'output_len = 3\n[[timeline.requests]]\nrid = "b"\narrive = 1\nprompt_len = 6\nprefix_of = "a"\nshared_len = 8\n')),
    "shared_len_past_source": ("timeline.requests[1].shared_len: 'a' has only 13 tokens (prompt and output), got 15", sub('output_len = 3\n', 'output_len = 3\n[[timeline.requests]]\nrid = "b"\narrive = 1\nprompt_len = 20\nprefix_of = "a"\nshared_len = 15\n')),
    "shared_len_without_prefix_of": ("timeline.requests[0].shared_len: needs prefix_of", sub('output_len = 3\n', 'output_len = 3\nshared_len = 4\n')),
    # run
    "unknown_design": ("run.designs[1]: unknown design 'magic'", sub('designs = ["translate"]', 'designs = ["translate", "magic"]').replace('[expect.translate]', '[expect.magic]\nverdict = "match"\nwhy = "w"\n[expect.translate]')),
    "unknown_backend": ("run.backends[0]: expected one of 'torch_native', 'torch_gather', 'flashinfer', 'trtllm_mha' or an import path", sub('designs = ["translate"]\n', 'designs = ["translate"]\nbackends = ["flashinfr"]\n')),
    "unknown_fault": ("run.faults[0]: expected one of", sub('designs = ["translate"]\n', 'designs = ["translate"]\nfaults = ["no_such_fault"]\n')),
    "fault_needs_prefix_cache": ("run.faults[0]: match_len_not_reset acts only with a prefix cache; eviction.prefix_cache is off", sub('designs = ["translate"]\n', 'designs = ["translate"]\nfaults = ["match_len_not_reset"]\n')),
    "fault_cannot_act": ("run.faults[0]: skip_memo_invalidate acts only in piecewise mode; graphs.modes has eager, full", sub('designs = ["translate"]\n', 'designs = ["translate"]\nfaults = ["skip_memo_invalidate"]\n')),
    "fused_without_fp8": ("run.kv_write: 'fused_fp8' needs pool.kv_dtype = 'fp8_e4m3', got 'float32'", sub('designs = ["translate"]\n', 'designs = ["translate"]\nkv_write = "fused_fp8"\n')),
    "timeout_zero": ("run.timeout_s: expected a number from", sub('designs = ["translate"]\n', 'designs = ["translate"]\ntimeout_s = 0\n')),
    # expectations
    "missing_expectation": ("expect.translate: missing table", sub('[expect.translate]\nverdict = "match"\nwhy = "re-translates every layer"\n', "")),
    "verdict_typo": ("expect.translate.verdict: expected one of 'match', 'diverge', 'error', 'invariant', got 'pass'", sub('verdict = "match"', 'verdict = "pass"')),
    "missing_why": ("expect.translate.why: missing required key", sub('why = "re-translates every layer"\n', "")),
    "mode_not_run": ("expect.translate.piecewise: mode not run", sub('verdict = "match"\n', 'verdict = "match"\npiecewise = "match"\n')),
    "without_faults_without_faults": ("expect.translate.without_faults: only allowed when run.faults is non-empty", sub('verdict = "match"\n', 'verdict = "match"\nwithout_faults = "match"\n')),
    "expect_for_unknown_design": ("expect.memoized: no such design in run.designs (translate)", BASE + '[expect.memoized]\nverdict = "match"\nwhy = "w"\n'),
    "by_backend_unknown": ("expect.translate.by_backend.other: no such backend in run.backends (torch_native, torch_gather)", BASE + '[expect.translate.by_backend.other]\nverdict = "diverge"\nwhy = "w"\n'),
}

out = HERE / "bad"
out.mkdir(exist_ok=True)
for old in out.glob("*.toml"):
    old.unlink()
for name, (fragment, text) in CASES.items():
    path = out / f"{name}.toml"
    head = f"# expect: {fragment}\n"
    if name == "not_utf8":
        path.write_bytes(head.encode() + b'description = "caf\xe9"\n' + BASE.split("\n", 1)[1].encode())
    elif name == "bom":
        path.write_text("\ufeff" + head + BASE, encoding="utf-8")
    else:
        path.write_text(head + text, encoding="utf-8")
print(len(CASES), "files")
