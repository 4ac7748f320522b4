-- Synthetic multi-tenant traces and their replay against a model, for the
-- eviction benchmark (tools/trace_bench.lua) and its spec.
--
--   local trace = require "tinyloop.policy.trace"
--   local reqs = trace.generate{ tenants = 20, requests = 300, sys_min = 200, sys_max = 1500, ... }
--   local r = trace.replay(model, reqs, { policy = version, shadows = { cost = v_cost } })
--   -- r.hit_rate, r.saved, r.prompt_tokens, r.shadow (report), r.seconds
--
-- A trace is an array of { tenant, session, turn, user = ids }: prompts
-- are built at replay time as tenant system prompt + session history (the
-- previous prompts and the model's actual outputs) + user, so a replay
-- sees real multi-turn prefixes. Deterministic for a seed.
local policy = require "tinyloop.policy"
local shadow = require "tinyloop.policy.shadow"

local _M = {}


-- A small deterministic PRNG (LCG), independent of math.random.
local function rng(seed)
    local s = seed % 2147483647
    if s <= 0 then
        s = s + 2147483646
    end
    return function(a, b)
        s = (s * 16807) % 2147483647
        local u = (s - 1) / 2147483646
        if not a then
            return u
        end
        return a + math.floor(u * (b - a + 1))
    end
end
_M.rng = rng


-- generate(opts) -> trace, tenants. opts: tenants = 20, requests = 300,
-- zipf = 1.1, sys_min = 200, sys_max = 1500, user_min = 16, user_max = 64,
-- p_continue = 0.6 (a request continues one of its tenant's sessions),
-- max_turns = 6, vocab = 320 (ids drawn from [4, vocab)), ctx = 2048,
-- max_tokens = 4, operator = 0 (tokens of a shared operator prompt), seed = 1.
function _M.generate(o)
    o = o or {}
    local r = rng(o.seed or 1)
    local nt, vocab = o.tenants or 20, o.vocab or 320
    local function ids(n)
        local t = {}
        for i = 1, n do
            t[i] = r(4, vocab - 1)
        end
        return t
    end
    local tenants = {}
    local weights, total = {}, 0
    for i = 1, nt do
        local t = { id = "t" .. i, tid = i, salt = 1000 + i, system = ids(r(o.sys_min or 200, o.sys_max or 1500)),
                    sessions = {} }
        tenants[i] = t
        weights[i] = 1 / i ^ (o.zipf or 1.1)
        total = total + weights[i]
    end
    local operator = ids(o.operator or 0)
    local out = {}
    local next_session = 0
    local ctx, mt = o.ctx or 2048, o.max_tokens or 4
    local umin, umax = o.user_min or 16, o.user_max or 64
    for _ = 1, o.requests or 300 do
        local x, ti = r() * total, nt
        for i = 1, nt do
            x = x - weights[i]
            if x <= 0 then
                ti = i
                break
            end
        end
        local t = tenants[ti]
        local s
        if #t.sessions > 0 and r() < (o.p_continue or 0.6) then
            s = t.sessions[r(1, #t.sessions)]
        end
        if not s then
            next_session = next_session + 1
            s = { id = next_session, turns = 0, len = #operator + #t.system }
            t.sessions[#t.sessions + 1] = s
        end
        local user = ids(r(umin, umax))
        if s.len + #user + mt * 2 > ctx or s.turns >= (o.max_turns or 6) then
            for i, x2 in ipairs(t.sessions) do
                if x2 == s then
                    table.remove(t.sessions, i)
                    break
                end
            end
            next_session = next_session + 1
            s = { id = next_session, turns = 0, len = #operator + #t.system }
            t.sessions[#t.sessions + 1] = s
        end
        s.turns = s.turns + 1
        s.len = s.len + #user + mt
        out[#out + 1] = { tenant = ti, session = s.id, turn = s.turns, user = user }
    end
    for _, t in ipairs(tenants) do
        t.sessions = nil
    end
    return out, tenants, operator
end


local function append(dst, src)
    local n = #dst
    for i = 1, #src do
        dst[n + i] = src[i]
    end
    return dst
end


-- replay(model, trace, tenants, operator, opts) -> result. opts: policy
-- (an eviction version: pushed into C), shadows ({ name = version }: run
-- beside the live cache) or shadow (a Shadow to feed), salts (default
-- true), max_tokens = 4, on_request(index, request) before each, log.
function _M.replay(model, reqs, tenants, operator, o)
    o = o or {}
    if o.policy then
        assert(policy.apply_eviction(model, o.policy))
    end
    local info = model:info()
    local sh = o.shadow
    if not sh and o.shadows then
        -- a block of positions takes one KV block per layer
        sh = shadow.new { capacity_blocks = math.floor(info.kv_blocks_total / info.n_layer),
                          block_size = info.kv_block_size,
                          policies = o.shadows }
    end
    local hist = {}
    local prompt_tokens, saved0 = 0, model:stats().prefill_tokens_saved
    local clock = os.clock()
    local wall = policy.now_ms()
    local salts = o.salts ~= false
    local failed = 0
    for idx, q in ipairs(reqs) do
        if o.on_request then
            o.on_request(idx, q)
        end
        local t = tenants[q.tenant]
        local h = hist[q.session]
        if not h or q.turn == 1 then
            h = append(append({ model.bos }, operator), t.system)
        end
        local prompt = append(append({}, h), q.user)
        local before = model:stats().prefill_tokens_saved
        local ok, out = pcall(model.generate, model, prompt, {
            max_tokens = o.max_tokens or 4, temperature = 0, ignore_eos = true,
            salt = salts and t.salt or 0, tenant = t.tid,
        })
        if not ok then
            failed = failed + 1
            out = {}
            if o.log then
                o.log("request failed: " .. tostring(out))
            end
        end
        local cached = model:stats().prefill_tokens_saved - before
        prompt_tokens = prompt_tokens + #prompt
        if sh then
            sh:feed(prompt, out, { salt = salts and t.salt or 0, tenant = t.tid, cached = cached })
        end
        hist[q.session] = append(prompt, out)       -- the next turn's history (prompt is not used again)
    end
    local s = model:stats()
    local saved = s.prefill_tokens_saved - saved0
    return {
        requests = #reqs, failed = failed, prompt_tokens = prompt_tokens, saved = saved,
        hit_rate = prompt_tokens > 0 and saved / prompt_tokens or 0, evictions = s.evictions,
        cpu_seconds = os.clock() - clock, seconds = (policy.now_ms() - wall) / 1000,
        shadow = sh and sh:report(), shadow_text = sh and sh:format(),
    }
end


return _M
