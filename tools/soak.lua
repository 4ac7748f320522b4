-- soak.lua - a bounded soak of one engine instance (real nginx on loopback,
-- stories260K): CLIENTS concurrent clients for SECONDS mixing streams, plain
-- and chat completions under three tenants, clients that disconnect after
-- the first event, and bad requests, with two edits of the tenants policy
-- file (hot reloads) while requests run; then a SIGHUP with CLIENTS streams
-- in flight. `make soak`; SOAK_SECONDS (default 150, at most 540) and
-- SOAK_CLIENTS (default 64) change the load, TINYLOOP_TEST_MODEL the model.
--
-- It checks: 0 unexpected errors (a 5xx, a refused or timed-out connection,
-- a stream without [DONE] or with an error event, a bad request not answered
-- 4xx with an error object), 0 leaked KV blocks, worker RSS back within 10%
-- of its starting value, every stream across the SIGHUP finished, and the
-- old worker gone. It prints requests/s, TTFT p50/p99 and errors by kind.
--
-- Leaks: the server shows kv_blocks_used, which includes what the prefix
-- cache holds. The same FLUSH sequence (sequential greedy requests for every
-- tenant, then distinct prompts that overflow the KV arena) runs on the fresh
-- worker and again after the soak: LRU evicts everything older than the
-- flush first, so without a leak the cache ends in the same state and
-- kv_blocks_used is equal; a leaked block (no owner) shows as a difference.
-- The server gets a metrics key (TINYLOOP_METRICS_KEY, or one of its own) and
-- /metrics and /health are asked with it (the details of /health need it).
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "../tests/integration/?.lua;" .. package.path
local T = require "lib"
local signal = require "posix.signal"
local check = T.check

local SECONDS = math.min(tonumber(os.getenv("SOAK_SECONDS") or "") or 150, 540)
local CLIENTS = tonumber(os.getenv("SOAK_CLIENTS") or "") or 64
local METRICS_KEY = os.getenv("TINYLOOP_METRICS_KEY") or "soak-metrics-key"
local MAX_SEQ_LEN = 512
math.randomseed(tonumber(os.getenv("SOAK_SEED") or "") or 12345)

if not T.read(T.MODEL) then
    print("soak: no model at " .. T.MODEL)
    os.exit(1)
end


-- ---- the server --------------------------------------------------------------------------

local policy_path = T.tmpdir() .. "/soak-tenants.lua"
local policy_src = assert(T.read(T.ROOT .. "/lua/policies/tenants.lua"))
local function write_policy(version)
    local src, n = policy_src:gsub('version = "[^"]*"', 'version = "' .. version .. '"', 1)
    assert(n == 1, "the tenants policy has no version field")
    T.write(policy_path, src)
end
write_policy("soak.0")

local port = T.free_port()
local env = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = MAX_SEQ_LEN, TINYLOOP_INSTANCE = "soak",
    TINYLOOP_TENANTS_POLICY = policy_path, TINYLOOP_BACKEND = os.getenv("TINYLOOP_BACKEND") or "cpu" }
if METRICS_KEY then
    env.TINYLOOP_METRICS_KEY = METRICS_KEY
end
local srv, err = T.start{ name = "soak", conf = T.ROOT .. "/examples/nginx.conf", port = port, env = env }
if not srv then
    print("soak: the server did not start: " .. tostring(err))
    os.exit(1)
end


local function workers()
    local list = {}
    local p = io.popen("pgrep -P " .. srv.pid)
    for pid in p:lines() do
        list[#list + 1] = tonumber(pid)
    end
    p:close()
    return list
end


local function rss_kb(pid)
    local st = T.read("/proc/" .. pid .. "/status") or ""
    return tonumber(st:match("\nVmRSS:%s*(%d+)")) or 0
end


local function metrics()
    local headers = METRICS_KEY and { Authorization = "Bearer " .. METRICS_KEY } or nil
    local res = T.request(port, "GET", "/metrics", nil, headers, 10)
    if not res or res.status ~= 200 then
        return {}
    end
    return (T.prom(res.body))
end


local function health()
    local res = T.request(port, "GET", "/health", nil, { Authorization = "Bearer " .. METRICS_KEY }, 5)
    return res and res.status == 200 and res.json or nil
end


-- Waits (bounded) until nothing runs, queues or is in flight.
local function drain(limit)
    local deadline = T.now() + (limit or 60)
    while T.now() < deadline do
        local m = metrics()
        if m.tinyloop_requests_in_flight == 0 and m.tinyloop_requests_running == 0 and m.tinyloop_queue_depth == 0 then
            return true
        end
        T.sleep(0.2)
    end
    return false
end


-- ---- requests ------------------------------------------------------------------------------

local WORDS = { "cat", "dog", "tree", "sun", "moon", "ball", "girl", "boy", "park", "happy", "little",
    "big", "red", "blue", "fish", "bird", "rain", "cake", "toy", "friend" }
local KEYS = { false, "sk-acme", "sk-globex" }
local MAX_TOKENS = { [false] = 32, ["sk-acme"] = 96, ["sk-globex"] = 64 }   -- within each tenant's limits


local function story(n)
    local w = {}
    for i = 1, n do
        w[i] = WORDS[math.random(#WORDS)]
    end
    return "Once upon a time " .. table.concat(w, " ") .. "."
end


local function auth(key)
    return key and { Authorization = "Bearer " .. key } or nil
end


local BAD = {
    { body = "{not json", why = "invalid JSON" },
    { body = '{"prompt": 5}', why = "prompt of the wrong type" },
    { body = '{"prompt": "hi", "max_tokens": -3}', why = "negative max_tokens" },
    { body = '{"prompt": "hi", "temperature": "hot"}', why = "temperature of the wrong type" },
    { body = '{"messages": []}', path = "/v1/chat/completions", why = "empty messages" },
    { body = '{"prompt": "hi"}', headers = { Authorization = "Bearer sk-nobody" }, why = "unknown API key" },
}


-- One random request: { req for T.many, kind }.
local function random_request(stream_bias)
    local r = math.random()
    local key = KEYS[math.random(#KEYS)]
    local max_tokens = math.random(4, MAX_TOKENS[key])
    if r < 0.08 then
        local b = BAD[math.random(#BAD)]
        return { port = port, path = b.path or "/v1/completions", body = b.body, headers = b.headers }, "bad", b.why
    elseif r < 0.18 then
        return { port = port, path = "/v1/completions", headers = auth(key), close_after_first = true,
            body = { prompt = story(math.random(3, 30)), max_tokens = max_tokens, stream = true } }, "disconnect"
    elseif r < 0.18 + stream_bias then
        return { port = port, path = "/v1/completions", headers = auth(key),
            body = { prompt = story(math.random(3, 40)), max_tokens = max_tokens, stream = true,
                temperature = 0.8, seed = math.random(1, 1e6) } }, "stream"
    elseif r < 0.85 then
        return { port = port, path = "/v1/chat/completions", headers = auth(key),
            body = { messages = { { role = "user", content = story(math.random(3, 20)) } }, max_tokens = max_tokens,
                stream = math.random() < 0.5 } }, "chat"
    end
    return { port = port, path = "/v1/completions", headers = auth(key),
        body = { prompt = story(math.random(3, 40)), max_tokens = max_tokens } }, "completion"
end


-- Classifies one result of T.many: nil when as expected, else the error kind.
local function classify(kind, s)
    if kind == "disconnect" then
        if s.err and s.err ~= "timeout" then
            return "connect: " .. tostring(s.err)
        end
        return nil   -- the client left after the first event (or the whole short answer came first)
    end
    if s.err then
        return (s.err == "timeout" and "timeout" or "connect") .. " (" .. kind .. ")"
    end
    local res = s.res
    if not res or not res.status then
        return "no response (" .. kind .. ")"
    end
    if kind == "bad" then
        if res.status >= 400 and res.status < 500 and res.json and type(res.json.error) == "table" then
            return nil
        end
        return "bad request answered " .. res.status
    end
    if res.status ~= 200 then
        return "status " .. res.status .. " (" .. kind .. ")"
    end
    if (res.headers["content-type"] or ""):find("text/event-stream", 1, true) then
        local events, done = T.sse(res.body)
        for _, e in ipairs(events) do
            if type(e) ~= "table" then
                return "undecodable stream event"
            elseif e.error then
                return "stream error event: " .. tostring(e.error.message or e.error.type or e.error)
            end
        end
        if not done then
            return "stream without [DONE] (" .. kind .. ")"
        end
        return nil
    end
    if not (res.json and res.json.choices and res.json.choices[1]) then
        return "200 without choices (" .. kind .. ")"
    end
    return nil
end


local stats = { requests = 0, by_kind = {}, errors = {}, n_errors = 0, ttft = {} }


local function record(batch, results)
    for i, s in ipairs(results) do
        local kind = batch[i].kind
        stats.requests = stats.requests + 1
        stats.by_kind[kind] = (stats.by_kind[kind] or 0) + 1
        local e = classify(kind, s)
        if e then
            stats.n_errors = stats.n_errors + 1
            stats.errors[e] = (stats.errors[e] or 0) + 1
            if stats.n_errors <= 5 then
                print("  unexpected: " .. e .. "  " .. ((s.res and s.res.body) or ""):sub(1, 200))
            end
        elseif kind ~= "disconnect" and s.t_first and s.res
            and (s.res.headers["content-type"] or ""):find("text/event-stream", 1, true) then
            stats.ttft[#stats.ttft + 1] = s.t_first
        end
    end
end


-- One round: CLIENTS requests started over the first 0.2 s, all awaited.
local function round(stream_bias, on_tick, n)
    local reqs, batch = {}, {}
    for i = 1, n or CLIENTS do
        local req, kind = random_request(stream_bias)
        req.at = math.random() * 0.2
        reqs[i] = req
        batch[i] = { kind = kind }
    end
    local results = T.many(reqs, { timeout = 120, on_tick = on_tick })
    record(batch, results)
    return results, batch
end


-- The flush, for every tenant in turn: one greedy chat request (its pinned
-- prompts), then distinct prompts, sequentially, that overflow the tenant's
-- KV budget (a tenant over budget evicts its own entries first) and together
-- the arena.
local FLUSH = {}
for i = 1, 16 do
    local w = {}
    for j = 1, 60 do
        w[j] = WORDS[(i * 7 + j * 3) % #WORDS + 1]
    end
    FLUSH[i] = "Zebra " .. i .. " " .. table.concat(w, " ")
end
local function flush()
    local ok = true
    for _, key in ipairs(KEYS) do
        local res = T.post(port, "/v1/chat/completions", { messages = { { role = "user", content = "Hello" } },
            max_tokens = 8, temperature = 0 }, auth(key), 30)
        ok = ok and res and res.status == 200
        for _, p in ipairs(FLUSH) do
            res = T.post(port, "/v1/completions", { prompt = p, max_tokens = 16, temperature = 0 }, auth(key), 30)
            ok = ok and res and res.status == 200
        end
    end
    return ok and drain(30)
end


local function percentile(list, p)
    if #list == 0 then
        return 0
    end
    table.sort(list)
    return list[math.max(1, math.ceil(#list * p))]
end


-- ---- the run --------------------------------------------------------------------------------

local ok_run, run_err = pcall(function()
    print(string.format("soak: %d clients for %d s on 127.0.0.1:%d (%s)", CLIENTS, SECONDS, port, T.MODEL))
    -- The starting values are taken once the worker has seen the load (one
    -- warm-up round: allocator arenas, JIT traces, the Lua heap's size).
    round(0.45)
    check("the server drains after the warm-up round", drain(60))
    check("the first flush runs", flush())
    local m0 = metrics()
    local w0 = workers()
    local rss0 = w0[1] and rss_kb(w0[1]) or 0
    print(string.format("start: worker %s RSS %d kB, kv_blocks_used %s of %s (cache: %s nodes, %s tokens)",
        tostring(w0[1]), rss0, tostring(m0.tinyloop_kv_blocks_used), tostring(m0.tinyloop_kv_blocks_total),
        tostring(m0.tinyloop_cache_nodes), tostring(m0.tinyloop_cache_tokens)))

    -- Phase 1: rounds of mixed requests; two policy edits land mid-round.
    local t0 = T.now()
    local warmup_requests = stats.requests
    local reloads_at = { SECONDS / 3, 2 * SECONDS / 3 }
    local reloads_done = 0
    local rounds = 0
    while T.now() - t0 < SECONDS do
        rounds = rounds + 1
        local pending = reloads_done < #reloads_at and T.now() - t0 >= reloads_at[reloads_done + 1]
        round(0.45, pending and function(t)
            if pending and t > 0.3 then
                pending = false
                reloads_done = reloads_done + 1
                write_policy("soak." .. reloads_done)
            end
        end or nil)
    end
    local elapsed = T.now() - t0
    local phase1_requests = stats.requests - warmup_requests
    check("the policy file was edited twice during the soak", reloads_done == 2, reloads_done)
    check("the server drains after the soak", drain(60))
    local h = health()
    check("the last policy edit is in force", h and h.policy == "soak.2", h and h.policy)
    local m1 = metrics()
    check("both edits were reloaded", (m1.tinyloop_policy_reloads_total or 0) >= 2, m1.tinyloop_policy_reloads_total)

    check("the flush after the soak runs", flush())
    local m2 = metrics()
    local w1 = workers()
    local rss1 = w1[1] and rss_kb(w1[1]) or 0
    local leaked = (m2.tinyloop_kv_blocks_used or -1) - (m0.tinyloop_kv_blocks_used or 0)
    print(string.format("after the soak: worker %s RSS %d kB (%+.1f%%), kv_blocks_used %s (%+d)",
        tostring(w1[1]), rss1, rss0 > 0 and (rss1 / rss0 - 1) * 100 or 0, tostring(m2.tinyloop_kv_blocks_used), leaked))
    check("the same worker served the whole soak (no crash, no respawn)", w1[1] == w0[1] and #w1 == 1,
        table.concat(w0, ",") .. " -> " .. table.concat(w1, ","))
    check("0 leaked KV blocks (same kv_blocks_used after the same flush)", leaked == 0, leaked)
    check("worker RSS back within 10% of its start", rss1 <= rss0 * 1.10,
        string.format("%d -> %d kB", rss0, rss1))

    -- Phase 2: a SIGHUP once a quarter of CLIENTS long streams are under way
    -- (or, after 0.5 s, any: admission may hold the rest in the queue).
    local hup_sent, in_flight_at_hup, outstanding_at_hup = false, 0, 0
    local before = stats.n_errors
    local reqs, batch = {}, {}
    for i = 1, CLIENTS do
        reqs[i] = { port = port, path = "/v1/completions", headers = auth("sk-acme"), at = math.random() * 0.1,
            body = { prompt = story(math.random(3, 20)), max_tokens = MAX_TOKENS["sk-acme"], stream = true,
                temperature = 0.8, seed = i } }
        batch[i] = { kind = "stream" }
    end
    record(batch, T.many(reqs, { timeout = 120, on_tick = function(t, st)
        if hup_sent then
            return
        end
        local n, open = 0, 0
        for _, s in ipairs(st) do
            if s.started and not s.done then
                open = open + 1
                if s.t_first then
                    n = n + 1
                end
            end
        end
        if n >= math.max(1, math.floor(CLIENTS / 4)) or (t > 0.5 and n >= 1) then
            hup_sent, in_flight_at_hup, outstanding_at_hup = true, n, open
            signal.kill(srv.pid, signal.SIGHUP)
        end
    end }))
    print(string.format("SIGHUP with %d streams in flight (%d requests outstanding)", in_flight_at_hup,
        outstanding_at_hup))
    check("SIGHUP was sent with streams in flight", hup_sent and in_flight_at_hup > 0)
    check("every stream across the SIGHUP ended as expected", stats.n_errors == before, stats.n_errors - before)
    local gone = false
    local deadline = T.now() + 60
    while T.now() < deadline do
        local w = workers()
        if #w == 1 and w[1] ~= w0[1] then
            gone = true
            break
        end
        T.sleep(0.2)
    end
    check("the old worker exits after its streams drain; one new worker serves", gone, table.concat(workers(), ","))
    local up = false
    deadline = T.now() + 30
    while T.now() < deadline and not up do
        up = health() ~= nil
        if not up then
            T.sleep(0.1)
        end
    end
    check("the new worker answers /health", up)
    check("the flush on the new worker runs", flush())
    local m3 = metrics()
    local w2 = workers()
    local rss2 = w2[1] and rss_kb(w2[1]) or 0
    print(string.format("after the SIGHUP: worker %s RSS %d kB (%+.1f%%), kv_blocks_used %s "
        .. "(cache: %s nodes, %s tokens)",
        tostring(w2[1]), rss2, rss0 > 0 and (rss2 / rss0 - 1) * 100 or 0, tostring(m3.tinyloop_kv_blocks_used),
        tostring(m3.tinyloop_cache_nodes), tostring(m3.tinyloop_cache_tokens)))
    -- Figure, not a check: after concurrent traffic a worker holds a few
    -- blocks more than a fresh one with the same cache (same nodes and
    -- tokens); the soak shows they do not grow (the leak check above).
    print(string.format("blocks held beyond a fresh worker's after the same flush: %d",
        (m0.tinyloop_kv_blocks_used or 0) - (m3.tinyloop_kv_blocks_used or 0)))
    check("the new worker's RSS within 10% of the first worker's start", rss2 <= rss0 * 1.10,
        string.format("%d -> %d kB", rss0, rss2))

    -- Figures.
    print(string.format("soak: %d rounds, %d requests in %.1f s = %.1f requests/s (phase 1)", rounds,
        phase1_requests, elapsed, phase1_requests / elapsed))
    local kinds = {}
    for k, n in pairs(stats.by_kind) do
        kinds[#kinds + 1] = k .. " " .. n
    end
    table.sort(kinds)
    print("requests by kind: " .. table.concat(kinds, ", "))
    print(string.format("TTFT p50 %.1f ms, p99 %.1f ms (%d streams, first event)", percentile(stats.ttft, 0.5) * 1000,
        percentile(stats.ttft, 0.99) * 1000, #stats.ttft))
    local errs = {}
    for k, n in pairs(stats.errors) do
        errs[#errs + 1] = k .. ": " .. n
    end
    table.sort(errs)
    print("unexpected errors by kind: " .. (#errs > 0 and table.concat(errs, ", ") or "none"))
    check("0 unexpected errors", stats.n_errors == 0, stats.n_errors)
end)
check("the soak ran to the end", ok_run, run_err)
if not ok_run or T.failed > 0 then
    print("error.log (tail):\n" .. T.error_log(srv):sub(-3000))
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
