-- Two tiers: a front nginx (examples/nginx-front.conf) routing across two
-- engine instances (examples/nginx.conf). A tenant's requests go to the
-- instance holding its prefix (cached tokens come back), tenants spread
-- over the instances, and stopping the instance that holds a tenant's
-- prefix fails over to the other one.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local cjson = require "cjson.safe"
local check = T.check

local tenants_file = T.tmpdir() .. "/tenants-front.lua"
local names = { "alpha", "beta", "gamma", "delta", "epsilon", "zeta" }
local lines = { "return {" }
for _, n in ipairs(names) do
    lines[#lines + 1] = string.format('    ["sk-%s"] = { name = "%s" },', n, n)
end
lines[#lines + 1] = "}"
T.write(tenants_file, table.concat(lines, "\n") .. "\n")

local long = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
    .. "One day, she saw a big red ball in the park and ran to get it."

local ok_run, run_err = pcall(function()
    local engines, addrs = {}, {}
    for _, name in ipairs({ "a", "b" }) do
        local port = T.free_port()
        local srv, err = T.start{ name = "engine-" .. name, conf = T.ROOT .. "/examples/nginx.conf", port = port,
            env = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = name,
                TINYLOOP_TENANTS = tenants_file } }
        if not check("engine instance " .. name .. " starts", srv, err) then
            return
        end
        engines[name] = srv
        addrs[#addrs + 1] = string.format("%s=127.0.0.1:%d", name, port)
    end
    local fport = T.free_port()
    local front, ferr = T.start{ name = "front", conf = T.ROOT .. "/examples/nginx-front.conf", port = fport,
        env = { TINYLOOP_BACKENDS = table.concat(addrs, ","),
            TINYLOOP_ROUTING_POLICY = T.ROOT .. "/lua/policies/routing.lua" }, health = "/front/status" }
    if not check("the front nginx starts", front, ferr) then
        return
    end
    local function ask(tenant, max_tokens, extra)
        local body = { prompt = long, max_tokens = max_tokens or 8, temperature = 0 }
        for k, v in pairs(extra or {}) do
            body[k] = v
        end
        local r = T.post(fport, "/v1/completions", body, { Authorization = "Bearer sk-" .. tenant }) or {}
        return r, r.headers and r.headers["x-tinyloop-instance"]
    end

    -- affinity
    local fs = T.request(fport, "GET", "/front/status") or {}
    check("the front routes with the routing policy", fs.json and type(fs.json.policy) == "string", fs.body)
    local r1, inst = ask("alpha")
    check("the front serves a completion", r1.status == 200 and inst ~= nil, r1.body)
    local same, cached = true, true
    for _ = 1, 4 do
        local r, i = ask("alpha")
        same = same and i == inst
        cached = cached and r.json and r.json.usage.prompt_tokens_details.cached_tokens > 0
    end
    check("a tenant's requests keep going to the instance holding its prefix", same)
    check("so they report cached tokens", cached)
    local used = {}
    for _, n in ipairs(names) do
        local _, i = ask(n, 2)
        if i then
            used[i] = (used[i] or 0) + 1
        end
    end
    check("tenants spread over both instances", used.a and used.b, cjson.encode(used))

    -- streaming through the front
    local rs = T.post(fport, "/v1/completions", { prompt = long, max_tokens = 20, temperature = 0, stream = true },
        { Authorization = "Bearer sk-beta" }) or {}
    local ev, done = T.sse(rs.body or "")
    local rn = ask("beta", 20)
    check("streaming passes through the front", rs.status == 200 and done
        and T.sse_text(ev) == (rn.json and rn.json.choices[1].text), rs.body)

    -- failover
    local holder = engines[inst]
    local other = inst == "a" and "b" or "a"
    check("the instance holding the tenant's prefix is stopped (by pid)", T.stop(holder))
    local rf, fi = ask("alpha")
    check("the front fails over to the other instance", rf.status == 200 and fi == other,
        tostring(rf.status) .. " " .. tostring(fi) .. " " .. tostring(rf.body))
    local rf2, fi2 = ask("alpha")
    check("the tenant now sticks to the new instance, which caches its prefix", rf2.status == 200 and fi2 == other
        and rf2.json and rf2.json.usage.prompt_tokens_details.cached_tokens > 0, rf2.body)
    local st = T.request(fport, "GET", "/front/status") or {}
    check("the front reports the failover", st.json and st.json.failovers >= 1, st.body)
    check("all processes are stopped (by pid)", T.stop(front) and T.stop(engines[other]))
end)
if not ok_run then
    check("the two-tier tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
