-- /health latency under load (issue 15, item 8): a child process probes
-- GET /health every 10 ms while, in the same worker,
--  (a) 4 clients send long prompts (422 tokens, near the 512 context) in
--      three waves, and one client sends a ~0.9 MB prompt;
--  (b) a tenant with a KV budget (acme, kv_budget 64) makes its first
--      request, which sets its budget in the engine;
--  (c) the tenants policy is edited and reloads.
-- It prints p50 / p99 / max. The goal is p99 under 50 ms; the test asserts
-- only p99 < 250 ms and every probe answered, which a loaded CI machine
-- (2 cores shared with other builds) holds: each probe is a sub-millisecond
-- handler, so p99 above 250 ms means the event loop stalled. The max shows
-- single stalls (a large prompt tokenized on the event loop: 0.5 s of CPU
-- for 875 KB of stories260K text, seconds on a loaded machine).
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local cjson = require "cjson.safe"
local unistd = require "posix.unistd"
local wait = require "posix.sys.wait"
local check = T.check

local P99_BOUND = 0.250
local PROBE_FOR = 6.0   -- seconds of probing (the load runs in its first 3)

local src = T.read(T.ROOT .. "/lua/policies/tenants.lua")
if not src or not pcall(require, "posix.sys.wait") then
    T.skip("latency", "the tenants policy or posix.sys.wait is absent")
    print(T.summary() and "" or "")
    os.exit(0)
end


local function percentile(sorted, p)
    if #sorted == 0 then
        return 0
    end
    return sorted[math.max(1, math.ceil(#sorted * p))]
end


local ok_run, run_err = pcall(function()
    local policy = T.tmpdir() .. "/latency-tenants.lua"
    T.write(policy, src)
    local port = T.free_port()
    local srv, err = T.start{ name = "latency", conf = T.ROOT .. "/examples/nginx.conf", port = port,
        env = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = "latency",
            TINYLOOP_TENANTS_POLICY = policy } }
    if not check("an instance with a tenants policy starts", srv, err) then
        return
    end
    local m0 = T.request(port, "GET", "/metrics")
    local reloads0 = m0 and T.prom(m0.body).tinyloop_policy_reloads_total or 0

    -- the probe: a child process, so the load's client work never delays it
    local out = T.tmpdir() .. "/latency-probes.txt"
    local pid = unistd.fork()
    if pid == 0 then
        local f = io.open(out, "w")
        local stop = T.now() + PROBE_FOR
        while T.now() < stop do
            local t0 = T.now()
            local r = T.request(port, "GET", "/health", nil, nil, 5)
            f:write(string.format("%d %.6f\n", r and r.status or 0, T.now() - t0))
            T.sleep(0.01)
        end
        f:close()
        unistd._exit(0)
    end

    local long = ("The little dog ran to the park and played with a red ball. "):rep(20) -- 422 tokens
    local huge = ("The cat sat on the mat with a hat. "):rep(25000)                     -- 875 KB
    local reqs = {}
    for wave = 0, 2 do
        for c = 1, 4 do
            reqs[#reqs + 1] = { port = port, path = "/v1/completions", at = 0.2 + wave * 1.0,
                body = { prompt = long, max_tokens = 16, temperature = 0.8, seed = c + wave * 4 } }
        end
    end
    reqs[#reqs + 1] = { port = port, path = "/v1/completions", at = 1.5,
        body = { prompt = huge, max_tokens = 4 } }
    local acme = #reqs + 1
    reqs[acme] = { port = port, path = "/v1/completions", at = 0.6, headers = { Authorization = "Bearer sk-acme" },
        body = { prompt = "Once upon a time", max_tokens = 8, temperature = 0 } }
    local edited = false
    local v2 = "latency-reload-2"
    local st = T.many(reqs, { timeout = 60, on_tick = function(now)
        if not edited and now >= 1.0 then
            edited = true
            T.write(policy, (src:gsub('version%s*=%s*"[^"]+"', 'version = "' .. v2 .. '"', 1)))
        end
    end })
    local _, _, code = wait.wait(pid)
    local answered, statuses = 0, {}
    for i, s in ipairs(st) do
        local status = s.res and s.res.status or 0
        statuses[i] = status
        answered = answered + (status > 0 and 1 or 0)
    end
    check("every load request was answered", answered == #reqs, cjson.encode(statuses))
    check("the budgeted tenant's first request is served", statuses[acme] == 200, cjson.encode(statuses))

    local lat, bad = {}, 0
    for line in (T.read(out) or ""):gmatch("[^\n]+") do
        local status, t = line:match("^(%d+) (%S+)$")
        lat[#lat + 1] = tonumber(t)
        if tonumber(status) ~= 200 then
            bad = bad + 1
        end
    end
    table.sort(lat)
    local p50, p99, mx = percentile(lat, 0.5), percentile(lat, 0.99), lat[#lat] or 0
    print(string.format("  /health latency over %d probes: p50 %.1f ms, p99 %.1f ms, max %.1f ms (goal: p99 < 50 ms)",
        #lat, p50 * 1e3, p99 * 1e3, mx * 1e3))
    check("the probe ran to its end", code == 0 and #lat > 20, tostring(#lat))
    check("every /health probe answered 200", bad == 0, bad .. " of " .. #lat)
    check(string.format("/health p99 stays under %d ms under load", P99_BOUND * 1e3), p99 < P99_BOUND,
        string.format("p99 %.1f ms", p99 * 1e3))

    -- the reload ran during the probe (worker 0 checks the file every 0.5 s)
    local reloaded = false
    for _ = 1, 40 do
        local m = T.request(port, "GET", "/metrics")
        if m and (T.prom(m.body).tinyloop_policy_reloads_total or 0) > reloads0 then
            reloaded = true
            break
        end
        T.sleep(0.1)
    end
    check("the policy edit was reloaded", reloaded)
    T.stop(srv)
end)
if not ok_run then
    check("the latency test ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
