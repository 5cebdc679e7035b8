"""SGLang 0.5.23's torch-native backend reads sliding-window layers through full-pool ids: a finding shown on
the installed code (``harness/sglang/torch_native_read.py`` says how)."""

import inspect

from harness.sglang.installed import load
from harness.sglang.torch_native_read import run_decode


def test_the_read_path_indexes_the_layers_buffer_with_req_to_token_and_never_translates():
    source = inspect.getsource(load().TorchNativeAttnBackend._run_sdpa_forward_decode)
    assert "req_to_token[req_pool_idx" in source and "k_cache[per_req_tokens]" in source
    assert "translate" not in source


def test_while_the_mapping_is_the_identity_decode_matches_attention_over_the_window():
    read = run_decode("identity")
    assert read.identity and read.error is None and read.max_abs_err < 1e-5


def test_once_the_mapping_diverges_in_range_decode_reads_other_rows_without_an_error():
    read = run_decode("in_range")
    assert not read.identity and read.error is None
    assert read.max_abs_err > 1e-2


def test_once_a_full_id_passes_the_swa_pool_decode_raises_index_error():
    read = run_decode("out_of_range")
    assert not read.identity
    assert read.error == "IndexError: index 17 is out of bounds for dimension 0 with size 17"
