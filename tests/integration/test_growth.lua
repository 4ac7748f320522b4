-- Bounded growth when a tenants policy derives tenants from request data
-- (issue 15, item 14), real nginx with stories260K: 200 distinct tenants,
-- each with its own system prompt, salt and KV budget, through a worker
-- that keeps at most 16 tenants: the pinned system-prompt pools and tenant
-- ids stay bounded (/metrics), nothing leaks in the KV, a returning tenant
-- still gets its prompt pinned and cached, and the worker keeps serving.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local cjson = require "cjson.safe"
local check = T.check

if not T.read(T.ROOT .. "/lua/tinyloop/policy.lua") then
    T.skip("tenant growth", "the policy runtime (lua/tinyloop/policy.lua) is absent")
    print(T.summary() and "" or "")
    os.exit(0)
end

local CAP, TENANTS = 16, 200

local ok_run, run_err = pcall(function()
    local path = T.tmpdir() .. "/growth-policy.lua"
    T.write(path, [[
-- Each X-Tenant header value is a tenant of its own (no API keys).
local P = { kind = "tenants", version = "growth.1" }
function P.resolve(req)
    local name = req.headers and req.headers["x-tenant"] or "anon"
    return { id = "t-" .. name, salt = true, priority = 0, kv_budget = 12,
        system = { "You are the helper of tenant " .. name .. "." } }
end
function P.self_test()
    assert(P.resolve({ headers = { ["x-tenant"] = "a" } }).id == "t-a")
end
return P
]])
    local port = T.free_port()
    local srv, err = T.start{ name = "growth", conf = T.ROOT .. "/examples/nginx.conf", port = port,
        env = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = "growth",
            TINYLOOP_TENANTS_POLICY = path, TINYLOOP_MAX_TENANTS = CAP } }
    if not check("an instance with a header-derived tenants policy starts", srv, err) then
        return
    end
    local function metrics()
        local r = T.request(port, "GET", "/metrics")
        return r and T.prom(r.body or "") or {}
    end
    local function chat(name)
        return T.post(port, "/v1/chat/completions", { messages = { { role = "user", content = "Hi." } },
            max_tokens = 4, temperature = 0 }, { ["X-Tenant"] = name }) or {}
    end
    local bad, max_pools, max_ids = 0, 0, 0
    for i = 1, TENANTS do
        local r = chat("n" .. i)
        if r.status ~= 200 then
            bad = bad + 1
        end
        if i % 20 == 0 then
            local m = metrics()
            max_pools = math.max(max_pools, m.tinyloop_pinned_pools or math.huge)
            max_ids = math.max(max_ids, m.tinyloop_tenant_ids or math.huge)
        end
    end
    local m = metrics()
    print(string.format("  %d tenants: at most %s pinned pools and %s tenant ids; now %s / %s; "
        .. "KV blocks used %s of %s", TENANTS, max_pools, max_ids, tostring(m.tinyloop_pinned_pools),
        tostring(m.tinyloop_tenant_ids), tostring(m.tinyloop_kv_blocks_used), tostring(m.tinyloop_kv_blocks_total)))
    check("every tenant's request succeeds", bad == 0, bad)
    check("/metrics reports the pinned pools and tenant ids", m.tinyloop_pinned_pools ~= nil
        and m.tinyloop_tenant_ids ~= nil)
    check("pinned system-prompt pools stay bounded by max_tenants", max_pools <= CAP
        and (m.tinyloop_pinned_pools or math.huge) <= CAP, max_pools)
    check("tenant ids stay bounded by max_tenants", max_ids <= CAP and (m.tinyloop_tenant_ids or math.huge) <= CAP,
        max_ids)
    check("the table is full, not emptied (the recent tenants are kept)", m.tinyloop_pinned_pools == CAP,
        m.tinyloop_pinned_pools)

    -- A tenant evicted long ago comes back: its prompt is pinned again, and
    -- its second request finds the prompt in the cache.
    chat("n1")
    T.sleep(0.3) -- the registration runs on the engine thread
    chat("n1")
    local r = chat("n1")
    local cached = r.json and r.json.usage and r.json.usage.prompt_tokens_details
        and r.json.usage.prompt_tokens_details.cached_tokens or 0
    check("a returning tenant's system prompt is cached again", r.status == 200 and cached > 0,
        r.body)
    -- Nothing leaks: once idle, the KV holds only the cache (no request).
    m = metrics()
    check("no request holds KV once idle", (m.tinyloop_requests_running or 1) == 0
        and (m.tinyloop_kv_blocks_used or math.huge) <= (m.tinyloop_kv_blocks_total or 0), cjson.encode({
            running = m.tinyloop_requests_running, used = m.tinyloop_kv_blocks_used }))
    local h = T.request(port, "GET", "/health")
    check("the worker still answers /health", h and h.status == 200, h and h.body)
    check("no Lua error in the log", not T.error_log(srv):find("lua entry thread aborted", 1, true),
        T.error_log(srv):sub(-2000))
end)
if not ok_run then
    check("the growth tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
