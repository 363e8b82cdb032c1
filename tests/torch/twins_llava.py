"""The LLaVA twin: Hugging Face `LlavaForConditionalGeneration` (transformers
4.5x, eager attention, training mode) written op for op in PyTorch: the CLIP
vision tower (CLIPVisionModel), the multimodal projector
(LlavaMultiModalProjector) and the Llama decoder (LlamaModel + lm_head, run
by twins.Llama's own methods, so that its layout is the Llama twin's), with
HF's Python scoping, so that what autograd saves, and what lives under
no_grad in a checkpointed forward, is what HF's model saves and keeps.

Followed: huggingface/transformers, src/transformers/models/llava/
modeling_llava.py at commit 00d3cdbeaab26587a543f75df7997a53a6fb146b
(LlavaModel.get_image_features, LlavaModel.forward,
LlavaForConditionalGeneration.forward), src/transformers/models/clip/
modeling_clip.py (CLIPVisionEmbeddings, eager_attention_forward,
CLIPAttention, CLIPMLP, CLIPEncoderLayer, CLIPEncoder, CLIPVisionTransformer,
CLIPVisionModel; the 4.5x CLIPEncoder collects the hidden states in its
loop, later files by output hooks: the same tensors) and
src/transformers/activations.py (QuickGELUActivation, GELUActivation).

Model YAML (tests/torch/models/llava.yaml): type multimodal, with three
stacks: vision (layers, hidden, heads, ffn, image_size, patch_size, channels,
activation quick_gelu or gelu, feature_layer: HF vision_feature_layer, an
index into the tower's hidden states, feature_select: default drops the
class token, full keeps it), projector (activation), decoder (the Llama
twin's fields). training: seq_len is the decoder's length, the image tokens
included.

The batch (batch_llava): input_ids (B, T) int64 with the image token
(vocab - 1) at positions 1 .. n_img (after one text token), text ids in
[0, vocab - 2] elsewhere; pixel_values (B, C, S, S) fp32; labels (B, T) int64.

Blocks (rec.block and bwd_mark names), in forward order:
  embedding          the decoder's token embedding; the rotary cos/sin tables,
                     made after the projector from the merged embeddings and
                     saved by every decoder block, are pinned to it (as in
                     twins.Llama)
  vision.embedding   CLIPVisionEmbeddings (patch Conv2d without bias, the
                     class token, the position embedding) and pre_layrnorm
  vision.layer.i     CLIPEncoderLayer i, every one of them: the last ones
                     past feature_layer run although their output feeds
                     nothing the loss reads; the last layer's block also
                     holds post_layernorm on the pooled class token
  projector          the feature selection, linear_1, act, linear_2, the
                     image-token mask (and HF's count checks), the cast to
                     the embeddings' dtype and the masked_scatter that puts
                     the image features in place of the image tokens
  block.i            LlamaDecoderLayer i
  head, loss         the final norm and lm_head, the cross-entropy
                     (twins.lm_loss)

What outlives what (HF's scoping): image_outputs (the tower's output, with
every hidden state) is a local of get_image_features, so the layers past
feature_layer and post_layernorm, whose outputs nothing downstream reads,
free what they saved when get_image_features returns: their graph is
unreachable from the loss. LlavaModel's output keeps image_features (the
projector's output cast to the embeddings' dtype) as image_hidden_states,
returned to the caller with the logits; here it is a local of run.

Checkpointing (ckpt): HF's gradient_checkpointing_enable checkpoints every
CLIPEncoderLayer (the unused ones too; hidden_states the only tensor
argument) and every LlamaDecoderLayer (run_blocks, CKPT_EVERY respected);
the vision layers are one segment each.
"""
import functools
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import twins  # noqa: E402  (twins.F: livebytes.py patches it)
from twins import Llama, bwd_mark, checkpoint, dropout, lm_loss, run_blocks  # noqa: E402

LAYER_NORM_EPS = 1e-5  # CLIPVisionConfig.layer_norm_eps
ATTENTION_DROPOUT = 0.0  # CLIPVisionConfig.attention_dropout


def quick_gelu(x):  # QuickGELUActivation.forward: x * sigmoid(1.702 x)
    return x * torch.sigmoid(1.702 * x)


def gelu(x):  # GELUActivation.forward: the exact (erf) GELU
    return twins.F.gelu(x)


ACT = {"quick_gelu": quick_gelu, "gelu": gelu}  # ACT2FN's entries used here


def image_tokens(doc):
    """The image tokens one image puts in the decoder's sequence: a patch
    each, plus the class token with feature_select full."""
    v = doc["model"]["stacks"]["vision"]
    n = (v["image_size"] // v["patch_size"]) ** 2
    return n + (1 if v.get("feature_select", "default") == "full" else 0)


def _module(**kw):
    m = nn.Module()
    for k, val in kw.items():
        setattr(m, k, val)
    return m


class Llava(Llama):
    """LlavaForConditionalGeneration (see the module docstring)."""

    def __init__(s, doc):
        nn.Module.__init__(s)
        st = doc["model"]["stacks"]
        v, pj, dm = st["vision"], st.get("projector") or {}, st["decoder"]
        Dv, Hv = v["hidden"], v["heads"]
        Fv = v.get("ffn", 4 * Dv)
        C, S, P = v.get("channels", 3), v["image_size"], v["patch_size"]
        s.Dv, s.Hv, s.dhv = Dv, Hv, Dv // Hv
        s.vscale = s.dhv ** -0.5  # CLIPAttention.scale
        s.image_size = S
        s.feature_layer = int(v.get("feature_layer", -2))
        s.feature_select = v.get("feature_select", "default")
        if s.feature_select not in ("default", "full"):
            raise SystemExit("twins_llava: feature_select %s (default or full)" % s.feature_select)
        vact, pact = v.get("activation", "quick_gelu"), pj.get("activation", "gelu")
        for a in (vact, pact):
            if a not in ACT:
                raise SystemExit("twins_llava: activation %s (%s)" % (a, ", ".join(ACT)))
        s.vact, s.pact = ACT[vact], ACT[pact]
        s.image_token_id = dm["vocab"] - 1  # the twin's LlavaConfig.image_token_id
        n_pos = (S // P) ** 2 + 1  # CLIPVisionEmbeddings.num_positions

        # Registered as LlavaForConditionalGeneration's are (model.parameters()
        # order): model.vision_tower.vision_model: embeddings (its own
        # class_embedding, then patch_embedding, position_embedding),
        # pre_layrnorm, encoder.layers.i (self_attn: k_proj, v_proj, q_proj,
        # out_proj; layer_norm1; mlp: fc1, fc2; layer_norm2), post_layernorm;
        # model.multi_modal_projector (linear_1, linear_2); model.language_model
        # (embed_tokens, layers, norm); lm_head.
        emb = _module(class_embedding=nn.Parameter(torch.randn(Dv)),
                      patch_embedding=nn.Conv2d(C, Dv, kernel_size=P, stride=P, bias=False),
                      position_embedding=nn.Embedding(n_pos, Dv))
        emb.register_buffer("position_ids", torch.arange(n_pos).expand((1, -1)), persistent=False)
        layers = nn.ModuleList()
        for _ in range(v["layers"]):
            attn = _module(k_proj=nn.Linear(Dv, Dv), v_proj=nn.Linear(Dv, Dv),
                           q_proj=nn.Linear(Dv, Dv), out_proj=nn.Linear(Dv, Dv))
            layers.append(_module(self_attn=attn, layer_norm1=nn.LayerNorm(Dv, eps=LAYER_NORM_EPS),
                                  mlp=_module(fc1=nn.Linear(Dv, Fv), fc2=nn.Linear(Fv, Dv)),
                                  layer_norm2=nn.LayerNorm(Dv, eps=LAYER_NORM_EPS)))
        vm = _module(embeddings=emb, pre_layrnorm=nn.LayerNorm(Dv, eps=LAYER_NORM_EPS),
                     encoder=_module(layers=layers),
                     post_layernorm=nn.LayerNorm(Dv, eps=LAYER_NORM_EPS))
        s.vision_tower = _module(vision_model=vm)
        D = dm["hidden"]
        # LlavaConfig.multimodal_projector_bias: True
        pb = pj.get("bias", True)
        s.multi_modal_projector = _module(linear_1=nn.Linear(Dv, D, bias=pb),
                                          linear_2=nn.Linear(D, D, bias=pb))
        # the decoder: the Llama twin's modules, registered after the tower
        # and the projector (LlamaModel's embed_tokens, layers, norm, its
        # rotary inv_freq buffer; then lm_head)
        dec = Llama(dm)
        for k in ("D", "H", "KV", "dh", "scaling", "softcap", "classes"):
            setattr(s, k, getattr(dec, k))
        s.embed, s.blocks, s.norm, s.lm_head = dec.embed, dec.blocks, dec.norm, dec.lm_head
        s.register_buffer("inv_freq", dec.inv_freq)
        if s.classes:
            raise SystemExit("twins_llava: a classification head on the decoder")
        # training.vision_tower: same (HF's gradient_checkpointing_enable:
        # the tower's layers checkpointed with the decoder's), none, full, or
        # frozen (model.vision_tower.requires_grad_(False), as LLaVA's
        # fine-tuning freezes it)
        s.vision_mode = doc.get("training", {}).get("vision_tower", "same")
        if s.vision_mode == "frozen":
            s.vision_tower.requires_grad_(False)

    # ------------------------------------------------------ the vision tower

    def vision_embeddings(s, emb, pixel_values):  # CLIPVisionEmbeddings.forward
        batch_size = pixel_values.shape[0]
        target_dtype = emb.patch_embedding.weight.dtype
        patch_embeds = emb.patch_embedding(pixel_values.to(dtype=target_dtype))
        patch_embeds = patch_embeds.flatten(2).transpose(1, 2)
        class_embeds = emb.class_embedding.expand(batch_size, 1, -1)
        embeddings = torch.cat([class_embeds, patch_embeds], dim=1)
        embeddings = embeddings + emb.position_embedding(emb.position_ids)
        return embeddings

    def clip_eager(s, query, key, value, attention_mask=None):  # modeling_clip.eager_attention_forward
        attn_weights = torch.matmul(query, key.transpose(-1, -2)) * s.vscale
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = twins.F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
        attn_weights = dropout(attn_weights, ATTENTION_DROPOUT)
        attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output, attn_weights

    def clip_attention(s, a, hidden_states):  # CLIPAttention.forward (no mask: the vision tower's)
        batch_size, seq_length, _ = hidden_states.shape
        queries = a.q_proj(hidden_states)
        keys = a.k_proj(hidden_states)
        values = a.v_proj(hidden_states)
        queries = queries.view(batch_size, seq_length, -1, s.dhv).transpose(1, 2)
        keys = keys.view(batch_size, seq_length, -1, s.dhv).transpose(1, 2)
        values = values.view(batch_size, seq_length, -1, s.dhv).transpose(1, 2)
        attn_output, attn_weights = s.clip_eager(queries, keys, values, None)
        attn_output = attn_output.reshape(batch_size, seq_length, -1).contiguous()
        attn_output = a.out_proj(attn_output)
        return attn_output, attn_weights

    def clip_mlp(s, mlp, hidden_states):  # CLIPMLP.forward
        hidden_states = mlp.fc1(hidden_states)
        hidden_states = s.vact(hidden_states)
        hidden_states = mlp.fc2(hidden_states)
        return hidden_states

    def clip_layer(s, lay, hidden_states):  # CLIPEncoderLayer.forward
        # the attention weights stay in `_` until the layer returns
        residual = hidden_states
        hidden_states = lay.layer_norm1(hidden_states)
        hidden_states, _ = s.clip_attention(lay.self_attn, hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = lay.layer_norm2(hidden_states)
        hidden_states = s.clip_mlp(lay.mlp, hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states

    def clip_encoder(s, rec, enc, inputs_embeds, ckpt):
        """CLIPEncoder.forward with output_hidden_states: every layer's
        input and the last output collected; each layer its own block (and,
        with ckpt, its own checkpoint). Returns (last_hidden_state,
        hidden_states)."""
        encoder_states = ()
        hidden_states = inputs_embeds
        ckpt = {"none": False, "full": True}.get(s.vision_mode, ckpt)
        for idx, encoder_layer in enumerate(enc.layers):
            encoder_states = encoder_states + (hidden_states,)
            name = "vision.layer.%d" % idx
            rec.block = name
            if ckpt:
                hidden_states = checkpoint(functools.partial(s.clip_layer, encoder_layer), hidden_states)
            else:
                hidden_states = s.clip_layer(encoder_layer, hidden_states)
            bwd_mark(name, hidden_states)
        encoder_states = encoder_states + (hidden_states,)
        return hidden_states, encoder_states

    def vision_model(s, rec, pixel_values, ckpt):
        """CLIPVisionModel.forward -> CLIPVisionTransformer.forward: returns
        (last_hidden_state, pooler_output, hidden_states)."""
        vm = s.vision_tower.vision_model
        rec.block = "vision.embedding"
        hidden_states = s.vision_embeddings(vm.embeddings, pixel_values)
        hidden_states = vm.pre_layrnorm(hidden_states)
        bwd_mark("vision.embedding", hidden_states)
        last_hidden_state, all_hidden_states = s.clip_encoder(rec, vm.encoder, hidden_states, ckpt)
        # still the last layer's block: the pooled class token's norm (its
        # output is the pooler_output nothing reads)
        pooled_output = last_hidden_state[:, 0, :]
        pooled_output = vm.post_layernorm(pooled_output)
        return last_hidden_state, pooled_output, all_hidden_states

    # -------------------------------------------------------------- LLaVA

    def projector(s, image_features):  # LlavaMultiModalProjector.forward
        p = s.multi_modal_projector
        hidden_states = p.linear_1(image_features)
        hidden_states = s.pact(hidden_states)
        hidden_states = p.linear_2(hidden_states)
        return hidden_states

    def get_image_features(s, rec, pixel_values, ckpt):  # LlavaModel.get_image_features
        # image_outputs is this function's local: the tower's unused tail
        # (the layers past feature_layer, post_layernorm) dies at return
        image_outputs = s.vision_model(rec, pixel_values, ckpt)
        rec.block = "projector"
        selected_image_feature = image_outputs[2][s.feature_layer]
        if s.feature_select == "default":
            selected_image_feature = selected_image_feature[:, 1:]
        image_features = s.projector(selected_image_feature)
        return image_features

    def run(s, rec, batch, ckpt):
        """LlavaForConditionalGeneration.forward -> LlavaModel.forward
        (input_ids and pixel_values given, labels to the loss), then the
        LlamaModel and the head as twins.Llama.run runs them."""
        input_ids, pixel_values, labels = batch
        B, T = input_ids.shape
        rec.block = "embedding"
        inputs_embeds = s.embed_tokens(input_ids)
        bwd_mark("embedding", inputs_embeds)
        image_features = s.get_image_features(rec, pixel_values, ckpt)  # rec.block: projector
        special_image_mask = (input_ids == s.image_token_id).unsqueeze(-1)
        special_image_mask = special_image_mask.expand_as(inputs_embeds).to(inputs_embeds.device)
        n_image_tokens = (input_ids == s.image_token_id).sum()
        # HF's check: an index of the embeddings by the mask (IndexBackward
        # keeps the mask), a transient
        if inputs_embeds[special_image_mask].numel() != image_features.numel():
            raise ValueError("image features and image tokens do not match: tokens %d, features %d"
                             % (int(n_image_tokens), image_features.shape[0] * image_features.shape[1]))
        image_features = image_features.to(inputs_embeds.device, inputs_embeds.dtype)
        inputs_embeds = inputs_embeds.masked_scatter(special_image_mask, image_features)
        bwd_mark("projector", inputs_embeds)

        # LlamaModel.forward on inputs_embeds (twins.Llama.run after its
        # embedding): the rotary tables, counted with the embedding block
        pos = torch.arange(T)[None]  # cache_position[None]: one row for the batch (LlamaModel.forward)
        cos, sin = s.rotary(inputs_embeds, pos)
        rec.pinned[cos.storage().data_ptr()] = "embedding"
        rec.pinned[sin.storage().data_ptr()] = "embedding"
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None].expand(B, 1, T, T)
        x = run_blocks(rec, s.blocks, s.block, inputs_embeds, ckpt, cos, sin, mask, pos)
        del mask, pos  # LlamaModel.forward's: it returns after the layers (and its norm)
        rec.block = "head"
        return lm_loss(rec, s.norm(x), s.lm_head, labels)


def build_llava(doc):
    m = doc["model"]
    if m.get("type") != "multimodal":
        raise SystemExit("twins_llava: model type %s" % m.get("type"))
    return Llava(doc)


def batch_llava(doc, model, B, T=None):
    """(input_ids (B, T), pixel_values (B, C, S, S), labels (B, T)): the
    image tokens at positions 1 .. n_img (0 .. n_img - 1 when T is n_img)."""
    st, tr = doc["model"]["stacks"], doc.get("training", {})
    v, V = st["vision"], st["decoder"]["vocab"]
    T = T or tr.get("seq_len", 16)
    n = image_tokens(doc)
    if T < n:
        raise SystemExit("twins_llava: seq_len %d under the %d image tokens" % (T, n))
    first = 1 if T > n else 0
    input_ids = torch.randint(0, V - 1, (B, T))
    input_ids[:, first:first + n] = V - 1
    S = v["image_size"]
    pixel_values = torch.randn(B, v.get("channels", 3), S, S)
    labels = torch.randint(0, V, (B, T))
    return input_ids, pixel_values, labels
