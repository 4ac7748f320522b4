#!/usr/bin/env python3
# An independent GPT-2 forward pass in plain Python (float64) over an f32
# GGUF: prints the last token's logits for the given ids. test_gpt2's
# reference values come from it (the spec there), as ik_llama.cpp's gpt2
# graph cannot serve (its FFN norm is RMSNorm without the bias).
#   python3 tools/ref_gpt2.py MODEL.gguf 1,5,77,...
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
        if len(dims) == 2: ts[name] = [list(data[r * dims[0]:(r + 1) * dims[0]]) for r in range(dims[1])]
        else: ts[name] = list(data)
    return kv, ts
kv, W = load(sys.argv[1]); ids = [int(x) for x in sys.argv[2].split(',')]
D = kv['gpt2.embedding_length']; L = kv['gpt2.block_count']; H = kv['gpt2.attention.head_count']
HKV = kv.get('gpt2.attention.head_count_kv', H); eps = kv['gpt2.attention.layer_norm_epsilon']; hd = D // H
def mv(M, x): return [sum(a * b for a, b in zip(row, x)) for row in M]
def ln(x, w, b):
    mu = sum(x) / len(x); var = sum((v - mu) ** 2 for v in x) / len(x); s = 1 / math.sqrt(var + eps)
    return [(v - mu) * s * wi + bi for v, wi, bi in zip(x, w, b)]
def gelu(v): return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * v * (1 + 0.044715 * v * v)))
xs = [[a + b for a, b in zip(W['token_embd.weight'][t], W['position_embd.weight'][p])] for p, t in enumerate(ids)]
for l in range(L):
    p = 'blk.%d.' % l
    qs, ks, vs = [], [], []
    for x in xs:
        h = ln(x, W[p + 'attn_norm.weight'], W[p + 'attn_norm.bias'])
        qkv = [a + b for a, b in zip(mv(W[p + 'attn_qkv.weight'], h), W[p + 'attn_qkv.bias'])]
        qs.append(qkv[:D]); ks.append(qkv[D:D + HKV * hd]); vs.append(qkv[D + HKV * hd:])
    out = []
    for i, x in enumerate(xs):
        att = []
        for hh in range(H):
            kh = hh // (H // HKV)
            q = qs[i][hh * hd:(hh + 1) * hd]
            sc = [sum(a * b for a, b in zip(q, ks[j][kh * hd:(kh + 1) * hd])) / math.sqrt(hd) for j in range(i + 1)]
            m = max(sc); e = [math.exp(s - m) for s in sc]; z = sum(e)
            att += [sum(e[j] / z * vs[j][kh * hd + d] for j in range(i + 1)) for d in range(hd)]
        o = [a + b for a, b in zip(mv(W[p + 'attn_output.weight'], att), W[p + 'attn_output.bias'])]
        x = [a + b for a, b in zip(x, o)]
        h = ln(x, W[p + 'ffn_norm.weight'], W[p + 'ffn_norm.bias'])
        u = [gelu(a + b) for a, b in zip(mv(W[p + 'ffn_up.weight'], h), W[p + 'ffn_up.bias'])]
        dn = [a + b for a, b in zip(mv(W[p + 'ffn_down.weight'], u), W[p + 'ffn_down.bias'])]
        out.append([a + b for a, b in zip(x, dn)])
    xs = out
h = ln(xs[-1], W['output_norm.weight'], W['output_norm.bias'])
logits = mv(W.get('output.weight', W['token_embd.weight']), h)
print(' '.join('%.6g' % v for v in logits))
