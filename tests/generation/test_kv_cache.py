"""The decoder's own KV cache against a plain reference: torch.cat of everything written."""

import pytest

torch = pytest.importorskip("torch")

from coa_lab.generation.kv_cache import GrowingCache, GrowingLayer  # noqa: E402


def _kv(rows, t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 3, t, 8, generator=g), torch.randn(rows, 3, t, 8, generator=g)


def test_appends_equal_concatenation_and_reads_are_views_of_one_buffer():
    layer, ref_k, ref_v = GrowingLayer(), [], []
    for step, t in enumerate([5, 1, 1, 70, 1, 1, 200]):  # prefill, decode, a long forced observation
        k, v = _kv(4, t, step)
        keys, values = layer.update(k, v)
        ref_k.append(k)
        ref_v.append(v)
        assert torch.equal(keys, torch.cat(ref_k, dim=2)) and torch.equal(values, torch.cat(ref_v, dim=2))
        assert keys.data_ptr() == layer._k.data_ptr()  # a view, not a copy
    assert layer.get_seq_length() == 279


def test_keys_and_values_keep_their_own_dtypes():
    """Under autocast the values come out of v_proj in bf16 and RoPE returns fp32 keys: the
    cache holds each as given (DynamicCache's concatenation would), with no upcast copy."""
    layer, ref_v = GrowingLayer(), []
    for step, t in enumerate([6, 1, 1, 90]):  # the last write regrows the buffers
        k, v = _kv(2, t, step)
        v = v.to(torch.bfloat16)
        keys, values = layer.update(k, v)
        ref_v.append(v)
        assert keys.dtype == torch.float32 and values.dtype == torch.bfloat16
        assert torch.equal(values, torch.cat(ref_v, dim=2))


def test_capacity_doubles_so_decoding_reallocates_rarely():
    layer, buffers = GrowingLayer(), set()
    layer.update(*_kv(2, 10, 0))
    for step in range(500):
        layer.update(*_kv(2, 1, step + 1))
        buffers.add(layer._k.data_ptr())
    assert layer._k.shape[2] >= 510
    assert len(buffers) <= 4  # 74 -> 148 -> 296 -> 592: log2 growth, not one per token


def test_compact_moves_only_the_last_rows_into_freed_slots():
    cache = GrowingCache()
    ks, vs = _kv(6, 7, 1)
    for i in range(2):
        cache.update(ks, vs, i)
    order = cache.compact([0, 2, 3, 5])  # rows 1 and 4 finished
    assert order == [0, 5, 2, 3]  # slot 1 now holds old row 5; slots 0, 2, 3 untouched
    for i in range(2):
        assert torch.equal(cache.layers[i].keys, ks[order])
        assert torch.equal(cache.layers[i].values, vs[order])
    # decoding goes on for the 4 remaining rows
    k2, v2 = _kv(4, 1, 2)
    keys, _ = cache.update(k2, v2, 0)
    assert torch.equal(keys, torch.cat([ks[order], k2], dim=2))
    assert cache.get_seq_length() == 8


def test_compact_to_nothing_and_keep_all():
    cache = GrowingCache()
    cache.update(*_kv(3, 4, 0), 0)
    assert cache.compact([0, 1, 2]) == [0, 1, 2]
    assert cache.compact([2]) == [2]
    assert cache.layers[0].keys.shape[0] == 1


def test_batch_select_copies_a_shared_prefix_to_its_members():
    cache = GrowingCache()
    k, v = _kv(2, 5, 3)
    cache.update(k, v, 0)
    index = torch.tensor([0, 0, 1, 1, 1])
    cache.batch_select_indices(index)
    k2, v2 = _kv(5, 2, 4)
    keys, values = cache.update(k2, v2, 0)
    assert torch.equal(keys, torch.cat([k[index], k2], dim=2))
    assert torch.equal(values, torch.cat([v[index], v2], dim=2))


def test_a_wrong_row_count_is_a_clear_error():
    layer = GrowingLayer()
    layer.update(*_kv(3, 2, 0))
    with pytest.raises(ValueError, match="3 rows"):
        layer.update(*_kv(2, 1, 1))


def test_sliding_window_models_keep_transformers_cache():
    from types import SimpleNamespace

    def model(**config):
        return SimpleNamespace(config=SimpleNamespace(get_text_config=lambda decoder: SimpleNamespace(**config)))

    assert GrowingCache.fits(model(layer_types=["full_attention"] * 4, sliding_window=None))
    assert not GrowingCache.fits(model(layer_types=["full_attention", "sliding_attention"]))
    assert GrowingCache.fits(model(sliding_window=None))
    assert not GrowingCache.fits(model(sliding_window=4096))


def test_decode_attention_reads_the_cache_view_with_grouped_heads_exactly():
    """One query token per row over the cache's strided view, 9 query heads on 3 KV heads, a
    left-padded row masked: the lab's CPU attention (SDPA with native grouped-query: no
    repeated KV heads) against a plain reference that repeats them and softmaxes."""
    from types import SimpleNamespace

    from coa_lab.generation.cpu_attention import sdpa_gqa_attention

    layer = GrowingLayer()
    layer.update(*_kv(4, 30, 0))
    keys, values = layer.update(*_kv(4, 1, 1))
    assert not keys.is_contiguous()  # a view of the larger buffer
    q = torch.randn(4, 9, 1, 8, generator=torch.Generator().manual_seed(2))
    mask = torch.ones(4, 1, 1, 31, dtype=torch.bool)
    mask[1, :, :, :12] = False  # row 1 was left-padded by 12
    out, _ = sdpa_gqa_attention(SimpleNamespace(is_causal=True), q, keys, values, mask, scaling=8 ** -0.5)
    k9, v9 = keys.repeat_interleave(3, dim=1), values.repeat_interleave(3, dim=1)
    scores = (q @ k9.transpose(-1, -2)) * 8 ** -0.5
    ref = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v9  # [4, 9, 1, 8]
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-5)


def _layer(rows, t, seed):
    layer = GrowingLayer()
    k, v = _kv(rows, t, seed)
    layer.update(k, v)
    return layer, k, v


def test_admitted_rows_are_right_aligned_with_zeros_on_their_left():
    live, k, v = _layer(3, 10, 1)
    other, k2, v2 = _layer(2, 6, 2)
    live.admit(other)
    assert live.rows == 5 and live.get_seq_length() == 10
    assert torch.equal(live.keys[:3], k) and torch.equal(live.values[:3], v)  # live rows untouched
    assert torch.equal(live.keys[3:, :, 4:], k2) and torch.equal(live.values[3:, :, 4:], v2)
    assert not live.keys[3:, :, :4].any() and not live.values[3:, :, :4].any()  # zeros, never NaN garbage
    k3, v3 = _kv(5, 1, 3)  # decoding goes on for all five rows
    keys, _ = live.update(k3, v3)
    assert keys.shape[2] == 11 and torch.equal(keys[:, :, 10:], k3)


def test_a_longer_admitted_prompt_moves_the_live_rows_right():
    live, k, v = _layer(2, 5, 1)
    other, k2, v2 = _layer(1, 9, 2)
    live.admit(other)
    assert live.get_seq_length() == 9 and live.rows == 3
    assert torch.equal(live.keys[:2, :, 4:], k) and not live.keys[:2, :, :4].any()
    assert torch.equal(live.values[:2, :, 4:], v) and torch.equal(live.keys[2:], k2)


def test_drop_front_forgets_dead_columns_and_keeps_the_rest():
    live, k, v = _layer(4, 12, 1)
    live.drop_front(5)
    assert live.get_seq_length() == 7
    assert torch.equal(live.keys, k[:, :, 5:]) and torch.equal(live.values, v[:, :, 5:])
    k2, v2 = _kv(4, 1, 2)
    keys, _ = live.update(k2, v2)
    assert torch.equal(keys, torch.cat([k[:, :, 5:], k2], dim=2))
