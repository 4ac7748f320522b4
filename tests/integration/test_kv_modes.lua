-- KV cache modes through the server (issue 17), stories260K in a real nginx
-- (examples/nginx.conf):
--  * TINYLOOP_KV_TYPE=q8 reaches the worker (its `env` directive), wins
--    over TINYLOOP_KV_INT4, and /metrics and /health name the mode; the
--    server completes requests, the same greedy text again from the cache;
--  * TINYLOOP_KV_INT4=1 alone reaches the engine (its own `env` directive):
--    the model opens in q4;
--  * a bad TINYLOOP_KV_TYPE leaves the server up without an engine, and
--    /health's reason names the variable and the value.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local check = T.check

local conf = T.ROOT .. "/examples/nginx.conf"
local OPS = { Authorization = "Bearer ops-key" }
-- stories260K: 5 layers, 4 KV heads x 8 dims. f16: 2 bytes x 2 (K, V) x 32
-- x 5 = 640 bytes per token; q8: 1 byte a value plus an f16 scale per group
-- of 8 (the head) = 400; q4: half a byte plus an f16 scale and an f16
-- minimum per group = 320.
local TOKEN_BYTES = { q8 = 400, q4 = 320 }

local function env(name, extra)
    local e = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = name,
        TINYLOOP_METRICS_KEY = "ops-key" }
    for k, v in pairs(extra or {}) do
        e[k] = v
    end
    return e
end


local function metrics(port)
    local m = T.request(port, "GET", "/metrics", nil, OPS)
    if not m then
        return {}, { "no answer" }, ""
    end
    local v, bad = T.prom(m.body)
    return v, bad, m.body
end


local function health(port)
    local h = T.request(port, "GET", "/health", nil, OPS)
    return h or { status = 0, body = "" }, h and h.json or {}
end


local ok_run, run_err = pcall(function()
    -- ---- TINYLOOP_KV_TYPE=q8 (and TINYLOOP_KV_INT4=1, which it overrides) -------------
    local port = T.free_port()
    local srv, err = T.start{ name = "kv-q8", conf = conf, port = port,
        env = env("kv-q8", { TINYLOOP_KV_TYPE = "q8", TINYLOOP_KV_INT4 = 1 }) }
    if check("a server with TINYLOOP_KV_TYPE=q8 starts", srv, err) then
        local v, bad, body = metrics(port)
        check("/metrics is well formed", #bad == 0, table.concat(bad, " | "))
        check("/metrics names the mode: tinyloop_kv_mode_info{mode=\"q8\"} 1",
            v['tinyloop_kv_mode_info{mode="q8"}'] == 1, body)
        local modes = 0
        for k in pairs(v) do
            if k:find("^tinyloop_kv_mode_info{") then
                modes = modes + 1
            end
        end
        check("exactly one mode is reported", modes == 1, body)
        check("/metrics tinyloop_kv_token_bytes is q8's", v.tinyloop_kv_token_bytes == TOKEN_BYTES.q8,
            v.tinyloop_kv_token_bytes)
        local h, hj = health(port)
        check("/health details name the mode", h.status == 200 and hj.kv_mode == "q8", h.body)

        local req = { prompt = "Once upon a time there was a little girl", max_tokens = 24, temperature = 0 }
        local a = T.post(port, "/v1/completions", req)
        local aj = a and a.json or {}
        local text = aj.choices and aj.choices[1] and aj.choices[1].text
        check("a completion works in q8", a and a.status == 200 and type(text) == "string" and #text > 0
            and aj.usage and aj.usage.completion_tokens == 24, a and a.body)
        local b = T.post(port, "/v1/completions", req)
        local bj = b and b.json or {}
        check("the same greedy request again gives the same text", b and b.status == 200 and bj.choices
            and bj.choices[1].text == text, b and b.body)
        v = metrics(port)
        check("... with its prompt from the prefix cache",
            (v.tinyloop_cached_prompt_tokens_total or 0) > 0, v.tinyloop_cached_prompt_tokens_total)
        T.stop(srv)
    end

    -- ---- TINYLOOP_KV_INT4=1 alone: read by the engine itself ------------------------------
    port = T.free_port()
    srv, err = T.start{ name = "kv-int4", conf = conf, port = port,
        env = env("kv-int4", { TINYLOOP_KV_INT4 = 1 }) }
    if check("a server with TINYLOOP_KV_INT4=1 starts", srv, err) then
        local v, _, body = metrics(port)
        check("TINYLOOP_KV_INT4 reaches the engine: mode q4", v['tinyloop_kv_mode_info{mode="q4"}'] == 1
            and v.tinyloop_kv_token_bytes == TOKEN_BYTES.q4, body)
        local r = T.post(port, "/v1/completions", { prompt = "Once", max_tokens = 8, temperature = 0 })
        check("a completion works in q4", r and r.status == 200, r and r.body)
        T.stop(srv)
    end

    -- ---- a bad TINYLOOP_KV_TYPE ---------------------------------------------------------------
    port = T.free_port()
    -- /v1/models answers without an engine: the server is up, the model is not
    srv, err = T.start{ name = "kv-bad", conf = conf, port = port, health = "/v1/models",
        env = env("kv-bad", { TINYLOOP_KV_TYPE = "q3" }) }
    if check("a server with TINYLOOP_KV_TYPE=q3 starts without an engine", srv, err) then
        local h, hj = health(port)
        print("  /health: " .. tostring(h.body))
        check("/health answers 503", h.status == 503, h.body)
        check("/health's reason names the variable and the value", type(hj.reason) == "string"
            and hj.reason:find("TINYLOOP_KV_TYPE", 1, true) and hj.reason:find('"q3"', 1, true), h.body)
        check("... and no retry (a configuration error)", hj.retry_in == nil, h.body)
        local c = T.post(port, "/v1/completions", { prompt = "Once", max_tokens = 4 })
        check("a completion is refused with 503", c and c.status == 503, c and c.body)
        check("the error log says it too", T.error_log(srv):find('TINYLOOP_KV_TYPE: expected a KV mode', 1, true)
            or T.error_log(srv):find('bad TINYLOOP_KV_TYPE', 1, true), T.error_log(srv))
        local v, bad = metrics(port)
        check("/metrics without a model is well formed and names no mode", #bad == 0
            and v['tinyloop_kv_mode_info{mode="q3"}'] == nil, table.concat(bad, " | "))
        T.stop(srv)
    end
end)
if not ok_run then
    check("the KV mode tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
