-- Who may reach what on a running server: a tenant with an api_key is
-- reached with that key only (a header naming it does not make a request
-- that tenant, whatever the policy says), tenant configurations that fail
-- to load refuse requests instead of opening access, /health without the
-- metrics key says only whether it serves, and /metrics needs the key when
-- one is set.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local check = T.check

local conf = T.ROOT .. "/examples/nginx.conf"
local src = T.read(T.ROOT .. "/lua/policies/tenants.lua")
local OPS = { Authorization = "Bearer ops-key" }
local PROMPT = "Once upon a time there was a little girl named Lily. She loved to play outside in the sun "
    .. "with her dog and her friends in the big green park near her house every day."


local function env(name, extra)
    local e = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = name }
    for k, v in pairs(extra or {}) do
        e[k] = v
    end
    return e
end


local function ask(port, headers, max_tokens, prompt)
    return T.post(port, "/v1/completions", { prompt = prompt or "Once upon a time", max_tokens = max_tokens or 4,
        temperature = 0 }, headers) or { status = 0, headers = {}, body = "" }
end


local function cached(r)
    local u = r.json and r.json.usage
    return u and u.prompt_tokens_details and u.prompt_tokens_details.cached_tokens, u and u.prompt_tokens
end


local ok_run, run_err = pcall(function()
    -- ---- the shipped tenants policy, with a metrics key ------------------------------------
    local path = T.tmpdir() .. "/tenants-auth.lua"
    T.write(path, src)
    local port = T.free_port()
    local srv, err = T.start{ name = "auth", conf = conf, port = port,
        env = env("auth", { TINYLOOP_TENANTS_POLICY = path, TINYLOOP_METRICS_KEY = "ops-key" }) }
    if not check("an instance with the shipped tenants policy and a metrics key starts", srv, err) then
        return
    end
    -- acme allows max_tokens 128, the keyless "public" tenant 32
    check("acme's key is served with acme's limits", ask(port, { Authorization = "Bearer sk-acme" }, 100).status == 200)
    local r = ask(port, { ["X-Tenant"] = "acme" }, 100)
    check("X-Tenant: acme without a key does not get acme's limits (400 over public's 32)", r.status == 400
        and r.json and r.json.error.param == "max_tokens", r.body)
    check("X-Tenant: globex without a key is served as public", ask(port, { ["X-Tenant"] = "globex" }, 8).status
        == 200)
    r = ask(port, { ["X-Tenant"] = "acme", Authorization = "Bearer sk-globex-wrong" })
    check("a wrong key with X-Tenant: acme is 401", r.status == 401 and r.json
        and r.json.error.code == "invalid_api_key", r.body)
    r = ask(port, { ["X-Tenant"] = "acme", Authorization = "Bearer sk-acmf" })
    check("a key one byte off acme's is 401", r.status == 401, r.body)

    -- acme's cache is not readable by naming acme
    local a1 = ask(port, { Authorization = "Bearer sk-acme" }, 4, PROMPT)
    local a2 = ask(port, { Authorization = "Bearer sk-acme" }, 4, PROMPT)
    local hit, n = cached(a2)
    check("acme's repeated prompt is served from acme's cache", a1.status == 200 and hit and n and hit >= n / 2,
        a2.body)
    local spy = ask(port, { ["X-Tenant"] = "acme" }, 4, PROMPT)
    local leak, n2 = cached(spy)
    check(string.format("X-Tenant: acme without a key does not see acme's cache (%s of %s cached)",
        tostring(leak), tostring(n2)), spy.status == 200 and leak and n2 and leak < n2 / 2, spy.body)

    -- ---- /health and /metrics ------------------------------------------------------------------
    local h = T.request(port, "GET", "/health") or {}
    check("/health without a key says only the status", h.status == 200 and h.json
        and h.json.status == "ok" and next(h.json, next(h.json)) == nil, h.body)
    check("/health without a key shows no pid, policy or queue", not (h.body or ""):find("pid", 1, true)
        and not (h.body or ""):find("policy", 1, true) and not (h.body or ""):find("queued", 1, true), h.body)
    h = T.request(port, "GET", "/health", nil, { Authorization = "Bearer sk-acme" }) or {}
    check("/health with a tenant's key is still minimal", h.json and h.json.pid == nil, h.body)
    h = T.request(port, "GET", "/health", nil, OPS) or {}
    local v0 = src:match('version%s*=%s*"([^"]+)"')
    check("/health with the metrics key shows the details", h.status == 200 and h.json and type(h.json.pid) ==
        "number" and h.json.policy == v0 and h.json.in_flight ~= nil and h.json.queued ~= nil, h.body)
    local m = T.request(port, "GET", "/metrics") or {}
    check("/metrics without the key is 401", m.status == 401 and m.json and m.json.error, m.body)
    m = T.request(port, "GET", "/metrics", nil, { Authorization = "Bearer sk-acme" }) or {}
    check("/metrics with a tenant's key is 401", m.status == 401, m.body)
    m = T.request(port, "GET", "/metrics", nil, OPS) or {}
    local vals, bad = T.prom(m.body or "")
    check("/metrics with the key answers Prometheus text", m.status == 200 and #bad == 0
        and vals.tinyloop_requests_in_flight ~= nil, m.body)
    T.stop(srv)

    -- ---- the server enforces the rule whatever the policy says ---------------------------------
    -- This policy passes the load-time checks (they probe x-tenant, x-tenant-id and tenant)
    -- but maps a header of its own to a keyed tenant: the server refuses it per request.
    local sly = T.tmpdir() .. "/tenants-sly.lua"
    T.write(sly, [[
local P = { kind = "tenants", version = "sly-1" }
P.tenants = { vip = { id = "vip", api_key = "sk-vip", salt = true, limits = { max_tokens = 64 } } }
P.default = { id = "public", salt = true, limits = { max_tokens = 8 } }
function P.resolve(req)
    if req.api_key == "sk-vip" then return P.tenants.vip end
    if req.api_key then return nil end
    if req.headers and req.headers["x-customer"] == "vip" then return P.tenants.vip end
    return P.default
end
return P
]])
    local sport = T.free_port()
    local ssrv, serr = T.start{ name = "sly", conf = conf, port = sport,
        env = env("sly", { TINYLOOP_TENANTS_POLICY = sly }) }
    if check("an instance with a policy that maps a header to a keyed tenant starts", ssrv, serr) then
        r = ask(sport, { ["X-Customer"] = "vip" })
        check("the server refuses a keyless request the policy maps to a keyed tenant (401)", r.status == 401
            and r.json and r.json.error.code == "invalid_api_key", r.body)
        check("the tenant's own key is served", ask(sport, { Authorization = "Bearer sk-vip" }, 32).status == 200)
        check("a keyless request the policy maps to public is served", ask(sport, nil, 8).status == 200)
        r = T.request(sport, "GET", "/metrics") or {}
        check("/metrics is open when no metrics key is set", r.status == 200, r.status)
        r = T.request(sport, "GET", "/health") or {}
        check("/health is minimal when no metrics key is set", r.json and r.json.status == "ok"
            and r.json.pid == nil, r.body)
        T.stop(ssrv)
    end

    -- ---- examples/nginx.conf's private listener, uncommented ---------------------------------------
    local pport, mport = T.free_port(), T.free_port()
    local psrv, perr = T.start{ name = "private", conf = conf, port = pport,
        env = env("private", { TINYLOOP_TENANTS_POLICY = path }),
        subst = { { "\n        # (location = /metrics { return 404; })", "\n        %1" },
            { "\n    # ", "\n    " }, { "127%.0%.0%.1:9145", "127.0.0.1:" .. mport } } }
    if check("the example's private metrics listener starts when uncommented", psrv, perr) then
        r = T.request(pport, "GET", "/metrics") or {}
        check("/metrics is not served on the public address", r.status == 404, r.status)
        r = T.request(mport, "GET", "/metrics") or {}
        check("/metrics is served on the private address", r.status == 200
            and (r.body or ""):find("tinyloop_requests_in_flight", 1, true), r.status)
        r = T.request(mport, "GET", "/health") or {}
        check("/health on the private address has the details", r.json and type(r.json.pid) == "number", r.body)
        T.stop(psrv)
    end

    -- ---- configurations that fail to load refuse requests ---------------------------------------
    local old = T.tmpdir() .. "/tenants-impersonation.lua"
    T.write(old, (src:gsub("function P%.resolve%(req%).-\nend\n", [[
function P.resolve(req)
    local t = by_key[req.api_key or ""]
    if not t and req.headers then
        t = P.tenants[req.headers["x-tenant"] or ""]
    end
    return t or P.default
end
]], 1):gsub("function P%.self_test%(%).-\nend\n", "", 1)))
    local oport = T.free_port()
    local osrv, oerr = T.start{ name = "impersonation", conf = conf, port = oport, health = "/v1/models",
        env = env("impersonation", { TINYLOOP_TENANTS_POLICY = old }) }
    if check("an instance whose tenants policy maps x-tenant to keyed tenants starts", osrv, oerr) then
        r = ask(oport, { ["X-Tenant"] = "acme" })
        check("that policy is rejected at load and requests are refused (503), not served openly",
            r.status == 503, r.body)
        check("the rejection names the rule", T.error_log(osrv):find("which has an api_key", 1, true),
            T.error_log(osrv):sub(-600))
        check("/health reports the instance unavailable", (T.request(oport, "GET", "/health") or {}).status == 503)
        T.write(old, src)
        local served = false
        for _ = 1, 40 do
            if ask(oport, { Authorization = "Bearer sk-acme" }).status == 200 then
                served = true
                break
            end
            T.sleep(0.1)
        end
        check("once the file is fixed the worker loads it and serves", served)
        check("and X-Tenant: acme without a key is still not acme", ask(oport, { ["X-Tenant"] = "acme" }, 100).status
            == 400)
        T.stop(osrv)
    end

    -- a policy whose self_test would run for minutes inside a C pattern function
    local slow = T.tmpdir() .. "/tenants-slow.lua"
    T.write(slow, (src:gsub("function P%.self_test%(%)", "function P.self_test()\n"
        .. "    assert(('a'):rep(1500):find('.-.-.-b') == nil)", 1)))
    local wport = T.free_port()
    local wsrv, werr = T.start{ name = "slow-policy", conf = conf, port = wport, health = "/v1/models",
        env = env("slow-policy", { TINYLOOP_TENANTS_POLICY = slow }) }
    if check("a worker whose tenants policy hangs at load starts anyway (the load has limits)", wsrv, werr) then
        r = ask(wport, { Authorization = "Bearer sk-acme" })
        check("its requests are refused (503) and the log says why", r.status == 503
            and T.error_log(wsrv):find("instruction limit", 1, true), r.body)
        T.stop(wsrv)
    end

    local bad_tenants = T.tmpdir() .. "/tenants-broken.lua"
    T.write(bad_tenants, 'return { ["sk-a"] = "not a table" }\n')
    local bport = T.free_port()
    local bsrv, berr = T.start{ name = "broken-tenants", conf = conf, port = bport, health = "/v1/models",
        env = env("broken-tenants", { TINYLOOP_TENANTS = bad_tenants }) }
    if check("an instance with a malformed TINYLOOP_TENANTS file starts", bsrv, berr) then
        r = ask(bport, nil)
        check("a malformed TINYLOOP_TENANTS file refuses requests (503) instead of open access",
            r.status == 503, r.body)
        T.stop(bsrv)
    end
end)
if not ok_run then
    check("the auth tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
