#!/usr/bin/env python3
# Independent forward passes in plain Python (float64) over an f32 GGUF, for
# the architectures ik_llama.cpp cannot be the reference for: prints the
# last token's logits for the given ids.
#   gpt2: its FFN norm is RMSNorm without the bias in ik's graph (test_gpt2).
#   olmo: ik's graph applies RoPE to K twice (test_arch_table).
#   granite: ik's graph scales the residual sum, not the branch (test_arch_table).
#   llama: the same pass as granite, without the multipliers; with
#     expert_count, Mixtral's routed FFN (ik's llama graph adds the normed
#     input where the residual belongs, test_moe); granitemoe: granite's
#     pass with Mixtral's FFN.
#   olmo2, olmoe: ik_llama.cpp has neither (test_moe, test_arch_table).
#   bloom, mpt: ALiBi; ik's graphs norm the FFN input with RMSNorm.
#   python3 tools/ref_forward.py MODEL.gguf 1,5,77,...
import struct, sys, math
def rd(f, fmt): return struct.unpack('<' + fmt, f.read(struct.calcsize('<' + fmt)))
def rstr(f): n, = rd(f, 'Q'); return f.read(n)
T = {0:'B',1:'b',2:'H',3:'h',4:'I',5:'i',6:'f',7:'?',10:'Q',11:'q',12:'d'}
def val(f, t):
    if t == 8: return rstr(f)
    if t == 9:
        et, = rd(f, 'I'); n, = rd(f, 'Q'); return [val(f, et) for _ in range(n)]
    return rd(f, T[t])[0]
def load(p):
    f = open(p, 'rb'); f.read(4); rd(f, 'I'); nt, nkv = rd(f, 'QQ')
    kv = {}
    for _ in range(nkv):
        k = rstr(f).decode(); t, = rd(f, 'I'); kv[k] = val(f, t)
    infos = []
    for _ in range(nt):
        name = rstr(f).decode(); nd, = rd(f, 'I'); dims = rd(f, 'Q' * nd); ty, = rd(f, 'I'); off, = rd(f, 'Q')
        infos.append((name, dims, ty, off))
    al = kv.get('general.alignment', 32); pos = f.tell(); base = (pos + al - 1) // al * al
    ts = {}
    for name, dims, ty, off in infos:
        assert ty == 0, name
        n = 1
        for d in dims: n *= d
        f.seek(base + off); data = struct.unpack('<%df' % n, f.read(4 * n))
        if len(dims) == 3:  # experts: [n_in, n_out, n]
            m = dims[0] * dims[1]
            ts[name] = [[list(data[e * m + r * dims[0]:e * m + (r + 1) * dims[0]]) for r in range(dims[1])]
                        for e in range(dims[2])]
        elif len(dims) == 2: ts[name] = [list(data[r * dims[0]:(r + 1) * dims[0]]) for r in range(dims[1])]
        else: ts[name] = list(data)
    return kv, ts
kv, W = load(sys.argv[1]); ids = [int(x) for x in sys.argv[2].split(',')]
A = kv['general.architecture'].decode()
def key(k, d=None): return kv.get(A + '.' + k, d)
D = key('embedding_length'); L = key('block_count'); H = key('attention.head_count')
HKV = key('attention.head_count_kv', H); hd = D // H
eps = key('attention.layer_norm_epsilon', key('attention.layer_norm_rms_epsilon'))
emb_mul = key('embedding_scale', 0.0) or 1.0; res_mul = key('residual_scale', 0.0) or 1.0
att_scale = key('attention.scale', 0.0) or 1 / math.sqrt(hd); logit_div = key('logit_scale', 0.0) or 1.0
base = key('rope.freq_base', 10000.0); clamp = key('attention.clamp_kqv', 0.0)
def mv(M, x): return [sum(a * b for a, b in zip(row, x)) for row in M]
def add(a, b): return [u + v for u, v in zip(a, b)]
def ln(x, w=None, b=None):  # w None: olmo's LayerNorm without parameters
    mu = sum(x) / len(x); var = sum((v - mu) ** 2 for v in x) / len(x); s = 1 / math.sqrt(var + eps)
    if w is None: return [(v - mu) * s for v in x]
    return [(v - mu) * s * wi + bi for v, wi, bi in zip(x, w, b)]
def rms(x, w):
    s = 1 / math.sqrt(sum(v * v for v in x) / len(x) + eps)
    return [v * s * wi for v, wi in zip(x, w)]
def gelu(v): return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * v * (1 + 0.044715 * v * v)))
def silu(v): return v / (1 + math.exp(-v))
def clip(x): return [min(max(v, -clamp), clamp) for v in x] if clamp > 0 else x
def rope(x, n, pos, neox=False):  # llama's adjacent pairs over each head, or NEOX's halves
    y = list(x)
    for h0 in range(0, n * hd, hd):
        for i in range(hd // 2):
            th = pos * base ** (-2.0 * i / hd); c, s = math.cos(th), math.sin(th)
            ia, ib = (h0 + i, h0 + i + hd // 2) if neox else (h0 + 2 * i, h0 + 2 * i + 1)
            a, b = x[ia], x[ib]
            y[ia], y[ib] = a * c - b * s, a * s + b * c
    return y
def alibi_slope(h):  # ggml's soft_max: n2 the largest power of two <= H
    if A not in ('bloom', 'mpt'): return 0.0
    mb = key('attention.max_alibi_bias', 8.0); n2 = 2 ** int(math.floor(math.log2(H)))
    return 2 ** (-mb / n2 * (h + 1)) if h < n2 else 2 ** (-(mb / 2) / n2 * (2 * (h - n2) + 1))
def attend(qs, ks, vs, i, scale=None):
    scale = scale or 1 / math.sqrt(hd)
    att = []
    for hh in range(H):
        kh = hh // (H // HKV)
        q = qs[i][hh * hd:(hh + 1) * hd]
        sc = [sum(a * b for a, b in zip(q, ks[j][kh * hd:(kh + 1) * hd])) * scale + alibi_slope(hh) * (j - i)
              for j in range(i + 1)]
        m = max(sc); e = [math.exp(s - m) for s in sc]; z = sum(e)
        att += [sum(e[j] / z * vs[j][kh * hd + d] for j in range(i + 1)) for d in range(hd)]
    return att
Z = [0.0] * 65536  # an absent bias (mpt)
def b(name): return W.get(name, Z)
def gpt2_layer(xs, p):  # bloom, mpt: the same block (mpt: no biases, Q/K/V clipped)
    qs, ks, vs = [], [], []
    for x in xs:
        h = ln(x, W[p + 'attn_norm.weight'], b(p + 'attn_norm.bias'))
        qkv = clip(add(mv(W[p + 'attn_qkv.weight'], h), b(p + 'attn_qkv.bias')))
        qs.append(qkv[:D]); ks.append(qkv[D:D + HKV * hd]); vs.append(qkv[D + HKV * hd:])
    out = []
    for i, x in enumerate(xs):
        x = add(x, add(mv(W[p + 'attn_output.weight'], attend(qs, ks, vs, i)), b(p + 'attn_output.bias')))
        h = ln(x, W[p + 'ffn_norm.weight'], b(p + 'ffn_norm.bias'))
        u = [gelu(a) for a in add(mv(W[p + 'ffn_up.weight'], h), b(p + 'ffn_up.bias'))]
        out.append(add(x, add(mv(W[p + 'ffn_down.weight'], u), b(p + 'ffn_down.bias'))))
    return out
def olmo_layer(xs, p):
    hs = [ln(x) for x in xs]
    qs = [rope(clip(mv(W[p + 'attn_q.weight'], h)), H, i) for i, h in enumerate(hs)]
    ks = [rope(clip(mv(W[p + 'attn_k.weight'], h)), HKV, i) for i, h in enumerate(hs)]
    vs = [clip(mv(W[p + 'attn_v.weight'], h)) for h in hs]
    out = []
    for i, x in enumerate(xs):
        x = add(x, mv(W[p + 'attn_output.weight'], attend(qs, ks, vs, i)))
        h = ln(x)
        g = [silu(a) * b for a, b in zip(mv(W[p + 'ffn_gate.weight'], h), mv(W[p + 'ffn_up.weight'], h))]
        out.append(add(x, mv(W[p + 'ffn_down.weight'], g)))
    return out
E = key('expert_count', 0); K = key('expert_used_count', 0)
def ffn(h, p):  # llama's gated FFN, or Mixtral's top-K of E experts (softmax weights renormalized)
    if not E:
        return mv(W[p + 'ffn_down.weight'], [silu(a) * b for a, b in zip(mv(W[p + 'ffn_gate.weight'], h),
                                                                            mv(W[p + 'ffn_up.weight'], h))])
    lg = mv(W[p + 'ffn_gate_inp.weight'], h); mx = max(lg); pr = [math.exp(v - mx) for v in lg]
    top = sorted(range(E), key=lambda e: -pr[e])[:K]; out = [0.0] * D
    z = sum(pr[e] for e in top) if A != 'olmoe' else sum(pr)  # olmoe: the softmax weights as they are
    for e in top:
        g = [silu(a) * b for a, b in zip(mv(W[p + 'ffn_gate_exps.weight'][e], h), mv(W[p + 'ffn_up_exps.weight'][e], h))]
        out = add(out, [v * pr[e] / z for v in mv(W[p + 'ffn_down_exps.weight'][e], g)])
    if p + 'ffn_up_shexp.weight' in W:  # granitemoe's shared expert, ungated
        g = [silu(a) * b for a, b in zip(mv(W[p + 'ffn_gate_shexp.weight'], h), mv(W[p + 'ffn_up_shexp.weight'], h))]
        out = add(out, mv(W[p + 'ffn_down_shexp.weight'], g))
    return out
def llama_layer(xs, p):  # granite's multipliers are 1 for llama
    hs = [rms(x, W[p + 'attn_norm.weight']) for x in xs]
    qs = [rope(mv(W[p + 'attn_q.weight'], h), H, i) for i, h in enumerate(hs)]
    ks = [rope(mv(W[p + 'attn_k.weight'], h), HKV, i) for i, h in enumerate(hs)]
    vs = [mv(W[p + 'attn_v.weight'], h) for h in hs]
    out = []
    for i, x in enumerate(xs):
        x = add(x, [v * res_mul for v in mv(W[p + 'attn_output.weight'], attend(qs, ks, vs, i, att_scale))])
        out.append(add(x, [v * res_mul for v in ffn(rms(x, W[p + 'ffn_norm.weight']), p)]))
    return out
def olmo2_layer(xs, p, pre=False):  # olmoe (pre): pre norms, no post norms, experts
    hs = [rms(x, W[p + 'attn_norm.weight']) for x in xs] if pre else xs
    qs = [rope(rms(mv(W[p + 'attn_q.weight'], h), W[p + 'attn_q_norm.weight']), H, i, True) for i, h in enumerate(hs)]
    ks = [rope(rms(mv(W[p + 'attn_k.weight'], h), W[p + 'attn_k_norm.weight']), HKV, i, True) for i, h in enumerate(hs)]
    vs = [mv(W[p + 'attn_v.weight'], h) for h in hs]
    out = []
    for i, x in enumerate(xs):
        a = mv(W[p + 'attn_output.weight'], attend(qs, ks, vs, i))
        x = add(x, a if pre else rms(a, W[p + 'post_attention_norm.weight']))
        f = ffn(rms(x, W[p + 'ffn_norm.weight']), p) if pre else rms(ffn(x, p), W[p + 'post_ffw_norm.weight'])
        out.append(add(x, f))
    return out
if A in ('gpt2', 'starcoder'):  # starcoder: gpt2's graph in llama.cpp
    xs = [add(W['token_embd.weight'][t], W['position_embd.weight'][p]) for p, t in enumerate(ids)]
    layer, final = gpt2_layer, lambda x: ln(x, W['output_norm.weight'], W['output_norm.bias'])
elif A == 'olmo':
    xs = [list(W['token_embd.weight'][t]) for t in ids]
    layer, final = olmo_layer, ln
elif A in ('bloom', 'mpt'):
    xs = [list(W['token_embd.weight'][t]) for t in ids]
    if A == 'bloom': xs = [ln(x, W['token_embd_norm.weight'], W['token_embd_norm.bias']) for x in xs]
    layer, final = gpt2_layer, lambda x: ln(x, W['output_norm.weight'], b('output_norm.bias'))
elif A in ('olmo2', 'olmoe'):
    xs = [list(W['token_embd.weight'][t]) for t in ids]
    layer, final = (lambda xs, p: olmo2_layer(xs, p, A == 'olmoe')), lambda x: rms(x, W['output_norm.weight'])
elif A in ('llama', 'granite', 'granitemoe'):
    xs = [[v * emb_mul for v in W['token_embd.weight'][t]] for t in ids]
    layer, final = llama_layer, lambda x: rms(x, W['output_norm.weight'])
else:
    sys.exit('ref_forward: architecture %s is not one of gpt2, starcoder, bloom, mpt, olmo, olmo2, olmoe, llama, '
             'granite, granitemoe' % A)
for l in range(L): xs = layer(xs, 'blk.%d.' % l)
logits = [v / logit_div for v in mv(W.get('output.weight', W['token_embd.weight']), final(xs[-1]))]
print(' '.join('%.6g' % v for v in logits))
