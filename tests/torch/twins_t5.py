"""The T5 twin: Hugging Face `T5ForConditionalGeneration` (transformers 4.5x,
eager attention, training mode) written op for op in PyTorch, with HF's own
Python scoping (T5Stack, T5Block, T5LayerSelfAttention,
T5LayerCrossAttention, T5LayerFF, T5DenseActDense / T5DenseGatedActDense,
T5Attention, T5LayerNorm), so that what autograd saves, and what lives under
no_grad in a checkpointed forward, is what HF's model saves and keeps.

Followed: huggingface/transformers, src/transformers/models/t5/modeling_t5.py
at commit 6b8b757dfcb582379a64f013cdce46c43629f2b0 (the EncoderDecoderCache /
cache_position / _update_causal_mask generation of the file, 4.48 - 4.53).

Model YAML (tests/torch/models/t5.yaml): type encoder-decoder; layers
(encoder blocks), decoder_layers, hidden (d_model), heads, head_dim (d_kv),
ffn (d_ff), activation relu (T5DenseActDense, t5 v1.0) or geglu
(T5DenseGatedActDense with gelu_new, flan-t5 / t5 v1.1), relative_buckets,
relative_max_distance, vocab, tied_embeddings (true: lm_head is the shared
embedding and the decoder output is scaled by d_model ** -0.5 first),
dropout (dropout_rate). training: seq_len (encoder tokens), target_len
(decoder tokens = labels).

Blocks (rec.block and bwd_mark names), in forward order:
  embedding            encoder embed_tokens, T5Stack's mask work before its
                       loop (ones attention mask, the (B,1,1,T) extended
                       mask, cache_position), dropout
  encoder.block.i      T5Block; block 0 computes the relative position bias
  encoder.final        final_layer_norm + dropout: the encoder output
  decoder.embedding    _shift_right(labels), embed_tokens, the decoder
                       stack's mask work (the (B,1,Td,Td) causal mask, the
                       (B,1,1,Te) inverted encoder mask, cache_position),
                       dropout
  decoder.block.i      self-attention, cross-attention over the encoder
                       output, FF; block 0 computes both position biases
  head                 decoder final_layer_norm + dropout, the tied rescale,
                       lm_head
  loss                 cross-entropy (ignore_index -100)
Tensors made in one block and saved by others are attributed (rec.pinned) to
the block that makes them: the extended masks and cache_position to
embedding / decoder.embedding, the position biases to the stack's block 0,
the encoder output to encoder.final.

Checkpointing (ckpt): each T5Block separately, with T5Stack's argument list
(hidden_states, causal_mask, position_bias, encoder_hidden_states,
encoder_extended_attention_mask, encoder_decoder_position_bias, None, None,
None, use_cache=False, output_attentions, return_dict, cache_position), as
HF's _gradient_checkpointing_func does; use_cache is forced off and
T5Attention.gradient_checkpointing is on (the zero cross-attention bias of
decoder block 0 then requires grad). twins.CKPT_EVERY is ignored: HF
checkpoints every block, the segments are always one block.

use_cache: T5Config.use_cache defaults to True and T5ForConditionalGeneration
passes it to the decoder in training too (only gradient checkpointing turns it
off), so without checkpointing the decoder's EncoderDecoderCache keeps every
self- and cross-attention key/value projection (the Linear outputs, views of
them) until the model's output is dropped. USE_CACHE[0] = False models a loop
that passes use_cache=False.
"""
import functools
import math
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from twins import bwd_mark, checkpoint, dropout, gelu_new, lm_loss  # noqa: E402

# T5Config.use_cache (True by default; see the docstring)
USE_CACHE = [True]
LAYER_NORM_EPS = 1e-6  # T5Config.layer_norm_epsilon
DECODER_START = 0      # T5Config.decoder_start_token_id (= pad_token_id)
PAD = 0                # T5Config.pad_token_id


class T5LayerNorm(nn.Module):
    def __init__(s, D, eps=LAYER_NORM_EPS):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(D))
        s.variance_epsilon = eps

    def forward(s, hidden_states):  # T5LayerNorm.forward
        # the variance in fp32, but the input itself (not its fp32 copy) is
        # what gets scaled; the result is cast only to an fp16/bf16 weight
        variance = hidden_states.to(torch.float32).pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + s.variance_epsilon)
        if s.weight.dtype in [torch.float16, torch.bfloat16]:
            hidden_states = hidden_states.to(s.weight.dtype)
        return s.weight * hidden_states


class _Cache:
    """DynamicCache (4.5x): the first update of a layer appends the key and
    value states as they are (no copy) and returns them."""

    def __init__(s):
        s.key_cache, s.value_cache = [], []

    def update(s, k, v, layer_idx, kw=None):
        if len(s.key_cache) <= layer_idx:
            s.key_cache.append(k)
            s.value_cache.append(v)
        else:
            s.key_cache[layer_idx] = torch.cat([s.key_cache[layer_idx], k], dim=-2)
            s.value_cache[layer_idx] = torch.cat([s.value_cache[layer_idx], v], dim=-2)
        return s.key_cache[layer_idx], s.value_cache[layer_idx]

    def get_seq_length(s):
        return s.key_cache[0].shape[-2] if s.key_cache else 0


class _EncoderDecoderCache:
    def __init__(s):
        s.self_attention_cache = _Cache()
        s.cross_attention_cache = _Cache()
        s.is_updated = {}

    def get_seq_length(s):
        return s.self_attention_cache.get_seq_length()


def _module(**kw):
    m = nn.Module()
    for k, v in kw.items():
        setattr(m, k, v)
    return m


class T5(nn.Module):
    """T5ForConditionalGeneration (see the module docstring)."""

    def __init__(s, m):
        super().__init__()
        D, H, V = m["hidden"], m["heads"], m["vocab"]
        dh, F_ = m.get("head_dim", D // H), m["ffn"]
        s.model_dim = D
        s.H, s.dh, s.inner = H, dh, H * dh
        s.p = float(m.get("dropout", 0.1))
        s.buckets = int(m.get("relative_buckets", 32))
        s.max_distance = int(m.get("relative_max_distance", 128))
        s.tied = bool(m.get("tied_embeddings", True))
        act = m.get("activation", "relu")
        if act not in ("relu", "geglu"):
            raise SystemExit("twins_t5: activation %s (relu or geglu)" % act)
        s.gated = act == "geglu"
        s.act = gelu_new if s.gated else torch.relu  # ACT2FN: nn.ReLU / NewGELUActivation
        s.gradient_checkpointing = False
        # registered as T5ForConditionalGeneration's are (model.parameters()
        # order): shared; encoder.block.i.layer.0.SelfAttention.{q,k,v,o,
        # relative_attention_bias (i = 0)}, layer.0.layer_norm,
        # layer.1.DenseReluDense.{wi | wi_0, wi_1}, wo, layer.1.layer_norm;
        # encoder.final_layer_norm; the decoder likewise with
        # layer.1.EncDecAttention between; lm_head (its weight the shared
        # one when tied, listed once)
        s.shared = nn.Embedding(V, D)
        s.encoder = s._stack(m["layers"], False, D, F_)
        s.decoder = s._stack(m.get("decoder_layers", m["layers"]), True, D, F_)
        s.lm_head = nn.Linear(D, V, bias=False)
        s._init_weights(D, F_, V)
        if s.tied:
            s.lm_head.weight = s.shared.weight

    def _attention(s, D, rel, layer_idx, is_decoder):  # T5Attention.__init__
        a = _module(q=nn.Linear(D, s.inner, bias=False), k=nn.Linear(D, s.inner, bias=False),
                    v=nn.Linear(D, s.inner, bias=False), o=nn.Linear(s.inner, D, bias=False))
        a.has_relative_attention_bias = rel
        if rel:
            a.relative_attention_bias = nn.Embedding(s.buckets, s.H)
        a.layer_idx, a.is_decoder = layer_idx, is_decoder
        return a

    def _stack(s, L, is_decoder, D, F_):  # T5Stack.__init__
        st = nn.Module()
        st.embed_tokens = s.shared
        st.is_decoder = is_decoder
        st.block = nn.ModuleList()
        for i in range(L):
            b = nn.Module()
            b.is_decoder = is_decoder
            b.layer = nn.ModuleList()
            b.layer.append(_module(SelfAttention=s._attention(D, i == 0, i, is_decoder),
                                   layer_norm=T5LayerNorm(D)))
            if is_decoder:
                b.layer.append(_module(EncDecAttention=s._attention(D, False, i, is_decoder),
                                       layer_norm=T5LayerNorm(D)))
            if s.gated:
                ff = _module(wi_0=nn.Linear(D, F_, bias=False), wi_1=nn.Linear(D, F_, bias=False),
                             wo=nn.Linear(F_, D, bias=False))
            else:
                ff = _module(wi=nn.Linear(D, F_, bias=False), wo=nn.Linear(F_, D, bias=False))
            b.layer.append(_module(DenseReluDense=ff, layer_norm=T5LayerNorm(D)))
            st.block.append(b)
        st.final_layer_norm = T5LayerNorm(D)
        return st

    @torch.no_grad()
    def _init_weights(s, D, F_, V):  # T5PreTrainedModel._init_weights (factor 1)
        s.shared.weight.normal_(0.0, 1.0)
        if not s.tied:
            s.lm_head.weight.normal_(0.0, 1.0)
        for st in (s.encoder, s.decoder):
            for b in st.block:
                for lay in b.layer:
                    a = getattr(lay, "SelfAttention", None) or getattr(lay, "EncDecAttention", None)
                    if a is not None:
                        a.q.weight.normal_(0.0, (D * s.dh) ** -0.5)
                        a.k.weight.normal_(0.0, D ** -0.5)
                        a.v.weight.normal_(0.0, D ** -0.5)
                        a.o.weight.normal_(0.0, s.inner ** -0.5)
                        if a.has_relative_attention_bias:
                            a.relative_attention_bias.weight.normal_(0.0, D ** -0.5)
                    else:
                        ff = lay.DenseReluDense
                        for n in ("wi", "wi_0", "wi_1"):
                            if hasattr(ff, n):
                                getattr(ff, n).weight.normal_(0.0, D ** -0.5)
                        ff.wo.weight.normal_(0.0, F_ ** -0.5)

    # ---------------------------------------------------------------- T5Attention

    @staticmethod
    def _relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
        relative_buckets = 0
        if bidirectional:
            num_buckets //= 2
            relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
            relative_position = torch.abs(relative_position)
        else:
            relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        relative_position_if_large = max_exact + (
            torch.log(relative_position.float() / max_exact)
            / math.log(max_distance / max_exact)
            * (num_buckets - max_exact)
        ).to(torch.long)
        relative_position_if_large = torch.min(
            relative_position_if_large, torch.full_like(relative_position_if_large, num_buckets - 1)
        )
        relative_buckets += torch.where(is_small, relative_position, relative_position_if_large)
        return relative_buckets

    def compute_bias(s, a, query_length, key_length, cache_position=None):  # T5Attention.compute_bias
        if cache_position is None:
            context_position = torch.arange(query_length, dtype=torch.long)[:, None]
        else:
            context_position = cache_position[:, None]
        memory_position = torch.arange(key_length, dtype=torch.long)[None, :]
        relative_position = memory_position - context_position
        relative_position_bucket = s._relative_position_bucket(
            relative_position, bidirectional=(not a.is_decoder),
            num_buckets=s.buckets, max_distance=s.max_distance)
        values = a.relative_attention_bias(relative_position_bucket)  # (q, k, heads)
        values = values.permute([2, 0, 1]).unsqueeze(0)  # (1, heads, q, k)
        return values

    def attention(s, a, hidden_states, mask=None, key_value_states=None, position_bias=None,
                  past_key_value=None, layer_head_mask=None, query_length=None, use_cache=False,
                  output_attentions=False, cache_position=None):  # T5Attention.forward
        batch_size, seq_length = hidden_states.shape[:2]
        is_cross_attention = key_value_states is not None
        query_states = a.q(hidden_states)
        query_states = query_states.view(batch_size, -1, s.H, s.dh).transpose(1, 2)
        if past_key_value is not None:
            is_updated = past_key_value.is_updated.get(a.layer_idx)
            if is_cross_attention:
                curr_past_key_value = past_key_value.cross_attention_cache
            else:
                curr_past_key_value = past_key_value.self_attention_cache
        current_states = key_value_states if is_cross_attention else hidden_states
        if is_cross_attention and past_key_value is not None and is_updated:
            key_states = curr_past_key_value.key_cache[a.layer_idx]
            value_states = curr_past_key_value.value_cache[a.layer_idx]
        else:
            key_states = a.k(current_states)
            value_states = a.v(current_states)
            key_states = key_states.view(batch_size, -1, s.H, s.dh).transpose(1, 2)
            value_states = value_states.view(batch_size, -1, s.H, s.dh).transpose(1, 2)
            if past_key_value is not None:
                cache_position = cache_position if not is_cross_attention else None
                key_states, value_states = curr_past_key_value.update(
                    key_states, value_states, a.layer_idx, {"cache_position": cache_position})
                if is_cross_attention:
                    past_key_value.is_updated[a.layer_idx] = True

        # no 1/sqrt(d) scaling: folded into q's initialisation (Mesh TF)
        scores = torch.matmul(query_states, key_states.transpose(3, 2))

        if position_bias is None:
            key_length = key_states.shape[-2]
            real_seq_length = query_length if query_length is not None else cache_position[-1] + 1
            if not a.has_relative_attention_bias:
                position_bias = torch.zeros((1, s.H, seq_length, key_length), dtype=scores.dtype)
                if s.gradient_checkpointing and s.training:
                    position_bias.requires_grad = True
            else:
                position_bias = s.compute_bias(a, real_seq_length, key_length, cache_position=cache_position)
                position_bias = position_bias[:, :, -seq_length:, :]
            if mask is not None:
                causal_mask = mask[:, :, :, : key_states.shape[-2]]
                position_bias = position_bias + causal_mask

        position_bias_masked = position_bias  # no pruned heads
        scores += position_bias_masked

        attn_weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        attn_weights = dropout(attn_weights, s.p)  # nn.functional.dropout(training=True)
        if layer_head_mask is not None:
            attn_weights = attn_weights * layer_head_mask
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        attn_output = attn_output.view(batch_size, -1, s.inner)
        attn_output = a.o(attn_output)
        outputs = (attn_output, past_key_value, position_bias)
        if output_attentions:
            outputs = outputs + (attn_weights,)
        return outputs

    # ------------------------------------------------------------- the layers

    def layer_self_attention(s, lay, hidden_states, attention_mask=None, position_bias=None,
                             layer_head_mask=None, past_key_value=None, use_cache=False,
                             output_attentions=False, cache_position=None):  # T5LayerSelfAttention.forward
        normed_hidden_states = lay.layer_norm(hidden_states)
        attention_output = s.attention(
            lay.SelfAttention, normed_hidden_states, mask=attention_mask, position_bias=position_bias,
            layer_head_mask=layer_head_mask, past_key_value=past_key_value, use_cache=use_cache,
            output_attentions=output_attentions, cache_position=cache_position)
        hidden_states = hidden_states + dropout(attention_output[0], s.p)
        outputs = (hidden_states,) + attention_output[1:]
        return outputs

    def layer_cross_attention(s, lay, hidden_states, key_value_states, attention_mask=None,
                              position_bias=None, layer_head_mask=None, past_key_value=None,
                              use_cache=False, query_length=None, output_attentions=False,
                              cache_position=None):  # T5LayerCrossAttention.forward
        normed_hidden_states = lay.layer_norm(hidden_states)
        attention_output = s.attention(
            lay.EncDecAttention, normed_hidden_states, mask=attention_mask,
            key_value_states=key_value_states, position_bias=position_bias,
            layer_head_mask=layer_head_mask, past_key_value=past_key_value, use_cache=use_cache,
            query_length=query_length, output_attentions=output_attentions,
            cache_position=cache_position)
        layer_output = hidden_states + dropout(attention_output[0], s.p)
        outputs = (layer_output,) + attention_output[1:]
        return outputs

    def dense(s, ff, hidden_states):  # T5DenseActDense / T5DenseGatedActDense.forward
        if s.gated:
            hidden_gelu = s.act(ff.wi_0(hidden_states))
            hidden_linear = ff.wi_1(hidden_states)
            hidden_states = hidden_gelu * hidden_linear
        else:
            hidden_states = ff.wi(hidden_states)
            hidden_states = s.act(hidden_states)
        hidden_states = dropout(hidden_states, s.p)
        # wo is kept in fp32 (_keep_in_fp32_modules): under autocast the
        # bf16 activation is cast to fp32 here, and autocast casts it back
        if hidden_states.dtype != ff.wo.weight.dtype and ff.wo.weight.dtype != torch.int8:
            hidden_states = hidden_states.to(ff.wo.weight.dtype)
        hidden_states = ff.wo(hidden_states)
        return hidden_states

    def layer_ff(s, lay, hidden_states):  # T5LayerFF.forward
        forwarded_states = lay.layer_norm(hidden_states)
        forwarded_states = s.dense(lay.DenseReluDense, forwarded_states)
        hidden_states = hidden_states + dropout(forwarded_states, s.p)
        return hidden_states

    @staticmethod
    def _clamp(hidden_states):  # T5Block's fp16 clamp
        if hidden_states.dtype == torch.float16:
            clamp_value = torch.where(
                torch.isinf(hidden_states).any(),
                torch.finfo(hidden_states.dtype).max - 1000,
                torch.finfo(hidden_states.dtype).max,
            )
            hidden_states = torch.clamp(hidden_states, min=-clamp_value, max=clamp_value)
        return hidden_states

    def block(s, b, hidden_states, attention_mask=None, position_bias=None, encoder_hidden_states=None,
              encoder_attention_mask=None, encoder_decoder_position_bias=None, layer_head_mask=None,
              cross_attn_layer_head_mask=None, past_key_value=None, use_cache=False,
              output_attentions=False, return_dict=True, cache_position=None):  # T5Block.forward
        self_attention_outputs = s.layer_self_attention(
            b.layer[0], hidden_states, attention_mask=attention_mask, position_bias=position_bias,
            layer_head_mask=layer_head_mask, past_key_value=past_key_value, use_cache=use_cache,
            output_attentions=output_attentions, cache_position=cache_position)
        hidden_states, past_key_value = self_attention_outputs[:2]
        attention_outputs = self_attention_outputs[2:]
        hidden_states = s._clamp(hidden_states)

        do_cross_attention = b.is_decoder and encoder_hidden_states is not None
        if do_cross_attention:
            cross_attention_outputs = s.layer_cross_attention(
                b.layer[1], hidden_states, key_value_states=encoder_hidden_states,
                attention_mask=encoder_attention_mask, position_bias=encoder_decoder_position_bias,
                layer_head_mask=cross_attn_layer_head_mask, past_key_value=past_key_value,
                query_length=cache_position[-1] + 1, use_cache=use_cache,
                output_attentions=output_attentions)
            hidden_states, past_key_value = cross_attention_outputs[:2]
            hidden_states = s._clamp(hidden_states)
            attention_outputs = attention_outputs + cross_attention_outputs[2:]

        hidden_states = s.layer_ff(b.layer[-1], hidden_states)
        hidden_states = s._clamp(hidden_states)
        outputs = (hidden_states,)
        if use_cache:
            outputs = outputs + (past_key_value,) + attention_outputs
        else:
            outputs = outputs + attention_outputs
        return outputs

    # ---------------------------------------------------------------- T5Stack

    def invert_attention_mask(s, encoder_attention_mask):  # ModuleUtilsMixin.invert_attention_mask
        dtype = s.shared.weight.dtype  # self.dtype: the parameters'
        if encoder_attention_mask.dim() == 3:
            encoder_extended_attention_mask = encoder_attention_mask[:, None, :, :]
        if encoder_attention_mask.dim() == 2:
            encoder_extended_attention_mask = encoder_attention_mask[:, None, None, :]
        encoder_extended_attention_mask = encoder_extended_attention_mask.to(dtype=dtype)
        encoder_extended_attention_mask = (1.0 - encoder_extended_attention_mask) * torch.finfo(dtype).min
        return encoder_extended_attention_mask

    @staticmethod
    def _prepare_4d_causal_attention_mask_with_cache_position(
            attention_mask, sequence_length, target_length, dtype, cache_position, batch_size):
        if attention_mask is not None and attention_mask.dim() == 4:
            causal_mask = attention_mask
        else:
            min_dtype = torch.finfo(dtype).min
            causal_mask = torch.full((sequence_length, target_length), fill_value=min_dtype, dtype=dtype)
            if sequence_length != 1:
                causal_mask = torch.triu(causal_mask, diagonal=1)
            causal_mask *= torch.arange(target_length) > cache_position.reshape(-1, 1)
            causal_mask = causal_mask[None, None, :, :].expand(batch_size, 1, -1, -1)
            if attention_mask is not None:
                causal_mask = causal_mask.clone()
                mask_length = attention_mask.shape[-1]
                padding_mask = causal_mask[:, :, :, :mask_length] + attention_mask[:, None, None, :]
                padding_mask = padding_mask == 0
                causal_mask[:, :, :, :mask_length] = causal_mask[:, :, :, :mask_length].masked_fill(
                    padding_mask, min_dtype)
        return causal_mask

    def _update_causal_mask(s, attention_mask, input_tensor, cache_position, past_key_values):
        # eager: no flash/flex/sdpa shortcut
        past_seen_tokens = past_key_values.get_seq_length() if past_key_values is not None else 0
        dtype = input_tensor.dtype
        sequence_length = input_tensor.shape[1]
        target_length = (attention_mask.shape[-1] if isinstance(attention_mask, torch.Tensor)
                         else past_seen_tokens + sequence_length + 1)
        causal_mask = s._prepare_4d_causal_attention_mask_with_cache_position(
            attention_mask, sequence_length=sequence_length, target_length=target_length,
            dtype=dtype, cache_position=cache_position, batch_size=input_tensor.shape[0])
        return causal_mask

    def stack(s, rec, st, prefix, emb_name, final_name, ckpt, input_ids, attention_mask=None,
              encoder_hidden_states=None, encoder_attention_mask=None, use_cache=None):
        """T5Stack.forward (head masks None, no attentions or hidden states
        returned); returns (hidden_states, next_cache) as return_dict=False
        does. rec.block is emb_name on entry."""
        input_shape = input_ids.size()
        input_ids = input_ids.view(-1, input_shape[-1])
        if ckpt:  # gradient_checkpointing and training
            use_cache = False
        inputs_embeds = st.embed_tokens(input_ids)
        batch_size, seq_length = input_shape
        if st.is_decoder and use_cache:
            past_key_values = _EncoderDecoderCache()
        else:  # the encoder gets none
            past_key_values = None
        past_key_values_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        cache_position = torch.arange(past_key_values_length, past_key_values_length + seq_length)
        if attention_mask is None:
            mask_seq_length = past_key_values_length + seq_length
            attention_mask = torch.ones(batch_size, mask_seq_length)
        if st.is_decoder:
            causal_mask = s._update_causal_mask(
                attention_mask, inputs_embeds, cache_position,
                past_key_values.self_attention_cache if past_key_values is not None else None)
        elif attention_mask is not None:
            causal_mask = attention_mask[:, None, None, :]
            causal_mask = causal_mask.to(dtype=inputs_embeds.dtype)
            causal_mask = (1.0 - causal_mask) * torch.finfo(inputs_embeds.dtype).min
        else:
            causal_mask = None
        if st.is_decoder and encoder_hidden_states is not None:
            encoder_batch_size, encoder_sequence_length, _ = encoder_hidden_states.size()
            encoder_hidden_shape = (encoder_batch_size, encoder_sequence_length)
            if encoder_attention_mask is None:
                encoder_attention_mask = torch.ones(encoder_hidden_shape, dtype=torch.long)
            encoder_extended_attention_mask = s.invert_attention_mask(encoder_attention_mask)
        else:
            encoder_extended_attention_mask = None
        position_bias = None
        encoder_decoder_position_bias = None
        next_decoder_cache = None

        hidden_states = dropout(inputs_embeds, s.p)
        bwd_mark(emb_name, hidden_states)
        # made here, saved (with checkpointing) by every block's checkpoint
        pins = [t for t in (causal_mask, encoder_extended_attention_mask, cache_position) if t is not None]
        for t in pins:
            rec.pinned[t.storage().data_ptr()] = emb_name

        for i, layer_module in enumerate(st.block):
            name = "%s.block.%d" % (prefix, i)
            rec.block = name
            if ckpt:
                layer_outputs = checkpoint(
                    functools.partial(s.block, layer_module),
                    hidden_states, causal_mask, position_bias, encoder_hidden_states,
                    encoder_extended_attention_mask, encoder_decoder_position_bias,
                    None, None,  # layer_head_mask, cross_attn_layer_head_mask
                    None,  # past_key_value is always None with gradient checkpointing
                    use_cache, False, True, cache_position)
            else:
                layer_outputs = s.block(
                    layer_module, hidden_states, attention_mask=causal_mask, position_bias=position_bias,
                    encoder_hidden_states=encoder_hidden_states,
                    encoder_attention_mask=encoder_extended_attention_mask,
                    encoder_decoder_position_bias=encoder_decoder_position_bias,
                    layer_head_mask=None, cross_attn_layer_head_mask=None,
                    past_key_value=past_key_values, use_cache=use_cache, output_attentions=False,
                    return_dict=True, cache_position=cache_position)
            if use_cache is False:
                layer_outputs = layer_outputs[:1] + (None,) + layer_outputs[1:]
            hidden_states, next_decoder_cache = layer_outputs[:2]
            # the first layer makes the biases, the others are handed them
            position_bias = layer_outputs[2]
            if st.is_decoder and encoder_hidden_states is not None:
                encoder_decoder_position_bias = layer_outputs[3]
            if i == 0:
                for t in (position_bias, encoder_decoder_position_bias):
                    if t is not None:
                        rec.pinned[t.storage().data_ptr()] = name
                        pins.append(t)
            bwd_mark(name, hidden_states)

        rec.block = final_name
        hidden_states = st.final_layer_norm(hidden_states)
        hidden_states = dropout(hidden_states, s.p)
        next_cache = next_decoder_cache if use_cache else None
        # the stack's locals (masks, biases) go when it returns: forget
        # their storages (a later tensor may reuse the address)
        for t in pins:
            rec.pinned.pop(t.storage().data_ptr(), None)
        return (hidden_states, next_cache)

    # ------------------------------------------------- T5ForConditionalGeneration

    def _shift_right(s, input_ids):  # T5PreTrainedModel._shift_right
        shifted_input_ids = input_ids.new_zeros(input_ids.shape)
        shifted_input_ids[..., 1:] = input_ids[..., :-1].clone()
        shifted_input_ids[..., 0] = DECODER_START
        shifted_input_ids.masked_fill_(shifted_input_ids == -100, PAD)
        return shifted_input_ids

    def run(s, rec, batch, ckpt):  # T5ForConditionalGeneration.forward (labels given)
        input_ids, labels = batch
        s.gradient_checkpointing = bool(ckpt)
        use_cache = USE_CACHE[0]
        rec.block = "embedding"
        # encoder_config.use_cache = False
        encoder_outputs = s.stack(rec, s.encoder, "encoder", "embedding", "encoder.final", ckpt,
                                  input_ids, attention_mask=None, use_cache=False)
        hidden_states = encoder_outputs[0]
        bwd_mark("encoder.final", hidden_states)
        # the encoder output: made by encoder.final, saved by the decoder's
        # cross-attention k/v projections (by its checkpoints when
        # checkpointed), every decoder block the same storage
        enc_ptr = hidden_states.storage().data_ptr()
        rec.pinned[enc_ptr] = "encoder.final"

        rec.block = "decoder.embedding"
        decoder_input_ids = s._shift_right(labels)
        decoder_outputs = s.stack(rec, s.decoder, "decoder", "decoder.embedding", "head", ckpt,
                                  decoder_input_ids, attention_mask=None,
                                  encoder_hidden_states=hidden_states, encoder_attention_mask=None,
                                  use_cache=use_cache)
        rec.pinned.pop(enc_ptr, None)
        sequence_output = decoder_outputs[0]
        if s.tied:
            # rescale before projecting on the (shared) vocabulary embedding
            sequence_output = sequence_output * (s.model_dim ** -0.5)
        # lm_head, bwd_mark("head"), rec.block = "loss", CrossEntropyLoss
        # (ignore_index -100, F.cross_entropy's default) on the flattened logits
        return lm_loss(rec, sequence_output, s.lm_head, labels)


def build_t5(doc):
    m = doc["model"]
    if m.get("type") != "encoder-decoder":
        raise SystemExit("twins_t5: model type %s" % m.get("type"))
    return T5(m)


def batch_t5(doc, model, B, T=None, Td=None):
    """(input_ids (B, seq_len), labels (B, target_len)), int64 in [0, vocab)."""
    m, tr = doc["model"], doc.get("training", {})
    T = T or tr.get("seq_len", 16)
    Td = Td or tr.get("target_len", T)
    return (torch.randint(0, m["vocab"], (B, T)), torch.randint(0, m["vocab"], (B, Td)))
