-- The tenants policy in a running server: API keys resolve through the
-- policy (unknown key -> 401), and an edit of the policy file reloads in
-- every worker (two workers, connections spread with reuseport) through the
-- lua_shared_dict version counter; a broken edit keeps the old version.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local cjson = require "cjson.safe"
local check = T.check

local src = T.read(T.ROOT .. "/lua/policies/tenants.lua")
local pok = pcall(require, "tinyloop.policy")
if not src or not T.read(T.ROOT .. "/lua/tinyloop/policy.lua") then
    T.skip("policy reload", "the policy runtime (lua/tinyloop/policy.lua, lua/policies/tenants.lua) is absent")
    print(T.summary() and "" or "")
    os.exit(0)
end
local _ = pok

local ok_run, run_err = pcall(function()
    local path = T.tmpdir() .. "/tenants-policy.lua"
    T.write(path, src)
    local port = T.free_port()
    local srv, err = T.start{ name = "policy", conf = T.ROOT .. "/examples/nginx.conf", port = port,
        env = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = "policy",
            TINYLOOP_TENANTS_POLICY = path, TINYLOOP_METRICS_KEY = "ops-key" },
        subst = { { "worker_processes 1;", "worker_processes 2;" },
            { "(listen 127%.0%.0%.1:%d+);", "%1 reuseport;" } } }
    if not check("an instance with a tenants policy and two workers starts", srv, err) then
        return
    end
    local function versions()
        local seen = {}
        for _ = 1, 40 do
            local h = T.request(port, "GET", "/health", nil, { Authorization = "Bearer ops-key" })
            if h and h.json and h.json.pid then
                seen[h.json.pid] = h.json.policy
            end
        end
        return seen
    end
    local function all_are(seen, v)
        local n = 0
        for _, ver in pairs(seen) do
            if ver ~= v then
                return false
            end
            n = n + 1
        end
        return n >= 2
    end
    local v0 = src:match('version%s*=%s*"([^"]+)"')
    local seen = versions()
    check("both workers serve and report the policy version", all_are(seen, v0), cjson.encode(seen))

    local function ask(key, extra)
        local body = { prompt = "Once upon a time", max_tokens = 4, temperature = 0 }
        for k, v in pairs(extra or {}) do
            body[k] = v
        end
        return T.post(port, "/v1/completions", body, key and { Authorization = "Bearer " .. key } or nil) or {}
    end
    check("a key the policy knows is served", ask("sk-acme").status == 200)
    local r = ask("sk-nobody")
    check("a key the policy does not know is 401", r.status == 401 and r.json and r.json.error, r.body)
    check("the policy's limits apply (max_tokens over the tenant limit is 400)",
        ask("sk-globex", { max_tokens = 100 }).status == 400)
    check("a new tenant's key is 401 before the edit", ask("sk-initech").status == 401)

    -- edit: a new version with a new tenant
    local edited = src:gsub('version%s*=%s*"[^"]+"', 'version = "edited-2"', 1)
        :gsub("P%.tenants%s*=%s*{", 'P.tenants = {\n    initech = { id = "initech", api_key = "sk-initech", '
            .. 'salt = true, priority = 1 },', 1)
    T.write(path, edited)
    local reloaded = false
    for _ = 1, 40 do
        seen = versions()
        if all_are(seen, "edited-2") then
            reloaded = true
            break
        end
        T.sleep(0.1)
    end
    check("a policy edit reloads in all workers", reloaded, cjson.encode(seen))
    check("the new tenant's key is served after the edit", ask("sk-initech").status == 200)
    local m = T.prom((T.request(port, "GET", "/metrics", nil, { Authorization = "Bearer ops-key" }) or {}).body or "")
    check("metrics count the policy reload", (m.tinyloop_policy_reloads_total or 0) >= 1,
        m.tinyloop_policy_reloads_total)

    -- a broken edit is rejected; the old version keeps serving
    T.write(path, "return { kind = 'tenants', version = 'broken-3', resolve = function( end }")
    T.sleep(1.5)
    seen = versions()
    check("a broken edit is rejected and every worker keeps the previous version", all_are(seen, "edited-2"),
        cjson.encode(seen))
    check("requests are still served after the broken edit", ask("sk-initech").status == 200)
    check("the instance stops by pid", T.stop(srv))
end)
if not ok_run then
    check("the policy tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
