"""Chapter 12: the dry run's attention saves what the fused kernel of a real run saves, not the meta
device's math path; the math path stays available as `attention="math"`; and the memory verdict sets what
a rank holds beside its GPU's HBM.

Hand counts, float32 (4 bytes), b sequences of s tokens, width h, a heads (a/t and h/t on one tp rank):
the fused (flash) kernel saves q, k and v (3 b s h/t), its output, which is the output projection's input
(b s h/t), and one log-sum-exp per query and head (b a/t s); the math path saves the b a/t s s softmax
probabilities in place of the log-sum-exp (Dao et al. 2022, sec. 3.1; Korthikanti et al. 2022, sec. 4.1).
"""

from __future__ import annotations

import pytest
import torch

from distlab.dryrun import dry_run, from_published, predicted
from distlab.dryrun.attention import FusedAttentionOnMeta, check_attention
from distlab.dryrun.parity import small_layout
from distlab.dryrun.report import fits, fits_line
from distlab.models import GPTConfig
from distlab.parallel3d.config import block_ranges
from distlab.tensor_parallel.model import ParallelSelfAttention

E = 4  # float32


def _saved_by_attention(device: str, fused: bool, b: int = 2, s: int = 16, h: int = 32, a: int = 4) -> int:
    """Bytes autograd saves in one attention layer's forward (weights left out, each storage view once)."""
    torch.manual_seed(0)
    layer = ParallelSelfAttention(GPTConfig(vocab_size=8, block_size=s, n_layer=1, n_head=a, n_embd=h))
    layer = layer.to(device)
    weights = {p.untyped_storage()._cdata for p in layer.parameters()}
    seen: set[tuple[int, int, int]] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = (t.untyped_storage()._cdata, t.storage_offset(), t.nbytes)
        if key[0] not in weights:
            seen.add(key)
        return t

    x = torch.ones(b, s, h, device=device, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if fused:
            with FusedAttentionOnMeta():
                layer(x)
        else:
            layer(x)
    return sum(nbytes for *_, nbytes in seen)


def test_meta_attention_saves_what_the_fused_kernel_saves_on_real_tensors() -> None:
    b, s, h, a = 2, 16, 32, 4
    qkv_input, proj_input = b * s * h * E, b * s * h * E
    flash = qkv_input + 3 * b * s * h * E + proj_input + b * a * s * E  # q, k, v, output, log-sum-exp
    math = qkv_input + 3 * b * s * h * E + proj_input + b * a * s * s * E  # the probabilities instead
    assert _saved_by_attention("meta", fused=True) == flash
    assert _saved_by_attention("cpu", fused=False) == flash  # what a real CPU run's fused kernel saves
    assert _saved_by_attention("meta", fused=False) == math  # the meta device's own (math) path


def test_dry_run_holds_the_flash_count_and_the_math_option_the_s_by_s_count() -> None:
    layout = small_layout(dp=1, pp=2, tp=2, m=2, layers=3, hidden=16, heads=4, seq=8)
    b, s, heads_per_rank = 1, 8, 4 // 2
    blocks, in_flight = len(block_ranges(3, 2)[0]), min(2, 2)  # stage 0 under 1F1B: min(m, p)
    flash, math = dry_run(layout, 0), dry_run(layout, 0, attention="math")
    assert (flash.attention, math.attention) == ("flash", "math")
    per_block = heads_per_rank * s * s * b * E - heads_per_rank * s * b * E  # probabilities - log-sum-exp
    assert math.memory.activations - flash.memory.activations == blocks * in_flight * per_block
    assert flash.memory.params == math.memory.params and flash.memory.grads == math.memory.grads
    assert fits(flash) is None and "no memory verdict" in fits_line(flash)  # a toy layout has no GPU


def test_the_published_405b_layout_beside_an_h100() -> None:
    """Rank 5 of Llama 3's 16K layout at the lab's 2 micro-batches: 927 GB was the math path's figure
    at the full batch; with the fused kernel's saves the rank fits one H100's 80 GB, with the math path's
    it does not."""
    layout = from_published("llama3-405b-16k", microbatches=2)
    assert layout.gpu == "H100" and layout.hbm_bytes == 80e9
    flash = dry_run(layout, 5)
    assert flash.memory.total <= 80e9 and fits(flash) is True and fits_line(flash).endswith(": fits")
    want = predicted(layout, 5).stage_activations  # chapter 7's estimator, told the flash path
    assert flash.memory.activations == pytest.approx(want, rel=0.01)
    math_total = (flash.memory.total - flash.memory.activations
                  + predicted(layout, 5, attention="math").stage_activations)
    assert math_total > 80e9
    full = predicted(from_published("llama3-405b-16k"), 5)  # all 16 micro-batches in flight on stage 0
    assert full.stage_activations > 80e9  # the course's float32 trainer without recomputation: no fit


def test_bad_attention_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"attention='fused' is unknown; choose 'flash' .* or 'math'"):
        check_attention("fused")
    with pytest.raises(ValueError, match=r"attention='fused' is unknown"):
        dry_run(small_layout(1, 1, 1), 0, attention="fused")
