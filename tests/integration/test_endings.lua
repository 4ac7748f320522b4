-- Honest endings and accounting (issue 15, items 9-11), stories260K in a
-- real nginx:
--  * a small KV arena (TINYLOOP_KV_MEM): streams whose prompts fit together
--    but whose completions do not all finish with every token (admission
--    reserves max_tokens' blocks), and a request that can never fit is a
--    400 before anything is generated;
--  * the request timeout mid-stream ends with an OpenAI error event and no
--    [DONE]; without a stream it is a 504; both count as failed in /metrics;
--  * /v1/completions without max_tokens generates 16 tokens (OpenAI's
--    default), chat keeps its cap;
--  * a stop string: completion_tokens counts up to the token that completes
--    it, and tinyloop_stop_string_finishes_total counts the ending.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local cjson = require "cjson.safe"
local check = T.check

local conf = T.ROOT .. "/examples/nginx.conf"
-- stories260K: 5 layers, 4 KV heads x 8 dims, f16: 2048 bytes a block of 16
-- positions, so 5 blocks (10 KiB) per 16 positions of a sequence.
local BLOCKS = 100
local KV_MEM = BLOCKS * 2048

local function env(name, extra)
    local e = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = name }
    for k, v in pairs(extra or {}) do
        e[k] = v
    end
    return e
end


local function metrics(port)
    local m = T.request(port, "GET", "/metrics")
    return m and T.prom(m.body) or {}
end


local ok_run, run_err = pcall(function()
    -- ---- a small KV arena -------------------------------------------------------------
    local port = T.free_port()
    local srv, err = T.start{ name = "kv", conf = conf, port = port,
        env = env("kv", { TINYLOOP_KV_MEM = KV_MEM }) }
    if not check("an instance with a small KV arena starts", srv, err) then
        return
    end
    local m0 = metrics(port)
    check("its arena has " .. BLOCKS .. " blocks", m0.tinyloop_kv_blocks_total == BLOCKS,
        tostring(m0.tinyloop_kv_blocks_total))

    -- 4 streams of ~8 + 200 positions: 65 blocks each, so at most one runs
    -- at a time; all four prompts (5 blocks each) fit at once
    local prompts = { "Once upon a time", "The little dog", "Lily and Tom went", "One day, a bird" }
    local reqs = {}
    for i, p in ipairs(prompts) do
        reqs[i] = { port = port, path = "/v1/completions",
            body = { prompt = p, max_tokens = 200, temperature = 0, stream = true } }
    end
    local st = T.many(reqs, { timeout = 120 })
    local full, detail = 0, {}
    for i, s in ipairs(st) do
        local ev, done = T.sse(s.res and s.res.body or "")
        local last = ev[#ev] or {}
        local fin = last.choices and last.choices[1] and last.choices[1].finish_reason
        local used = last.usage and last.usage.completion_tokens
        detail[i] = { s.res and s.res.status, fin, used, done, last.error and last.error.code }
        if s.res and s.res.status == 200 and done and fin == "length" and used == 200 then
            full = full + 1
        end
    end
    check("4 streams that do not fit in KV together all finish with 200 tokens (no half-way failure)",
        full == 4, cjson.encode(detail))

    -- 8 + 400 positions need 130 blocks: never, even alone
    local big = { prompt = "Once upon a time", max_tokens = 400, temperature = 0 }
    local r = T.post(port, "/v1/completions", big) or {}
    check("a request that cannot fit in KV even alone is a 400 naming max_tokens", r.status == 400 and r.json
        and r.json.error.code == "kv_capacity_exceeded" and r.json.error.param == "max_tokens"
        and r.json.error.message:find("max_tokens 400", 1, true), r.body)
    big.stream = true
    r = T.post(port, "/v1/completions", big) or {}
    check("streamed, it is the same 400 before any event", r.status == 400 and r.json
        and r.json.error.code == "kv_capacity_exceeded", r.body)

    -- ---- default max_tokens -------------------------------------------------------------
    local d = T.post(port, "/v1/completions", { prompt = "Once upon a time", temperature = 0 }) or {}
    check("/v1/completions without max_tokens generates 16 tokens (OpenAI's default)", d.json and d.json.usage
        and d.json.usage.completion_tokens == 16 and d.json.choices[1].finish_reason == "length", d.body)
    local dc = T.post(port, "/v1/chat/completions", { messages = { { role = "user", content = "Hi" } },
        temperature = 0 }) or {}
    check("chat without max_tokens keeps its cap (256 tokens)", dc.json and dc.json.usage
        and dc.json.usage.completion_tokens == 256, dc.body)

    -- ---- stop strings ------------------------------------------------------------------
    local prompt = "Once upon a time"
    local g = T.post(port, "/v1/completions", { prompt = prompt, max_tokens = 60, temperature = 0 }) or {}
    local greedy = g.json and g.json.choices[1].text or ""
    -- a word past the first few tokens, so the engine has gone on by the time it is seen
    local stop = greedy:match("^%s*%S+%s+%S+%s+%S+%s+%S+%s+%S+%s+(%S+)") or "there"
    -- tokens up to the one completing the stop text: the shortest greedy run containing it
    local want
    for k = 1, 60 do
        local p = T.post(port, "/v1/completions", { prompt = prompt, max_tokens = k, temperature = 0 }) or {}
        if p.json and p.json.choices[1].text:find(stop, 1, true) then
            want = k
            break
        end
    end
    local mb = metrics(port)
    local rs = T.post(port, "/v1/completions", { prompt = prompt, max_tokens = 60, temperature = 0,
        stop = { stop } }) or {}
    local js = rs.json or {}
    check("a stop string ends the text before it", js.choices and js.choices[1].finish_reason == "stop"
        and greedy:sub(1, #js.choices[1].text) == js.choices[1].text
        and not js.choices[1].text:find(stop, 1, true), rs.body)
    check("completion_tokens counts up to the token that completes the stop string", want and js.usage
        and js.usage.completion_tokens == want, cjson.encode({ stop = stop, want = want,
            got = js.usage and js.usage.completion_tokens }))
    local ss = T.post(port, "/v1/completions", { prompt = prompt, max_tokens = 60, temperature = 0,
        stop = stop, stream = true }) or {}
    local sev, sdone = T.sse(ss.body or "")
    local slast = sev[#sev] or {}
    check("streamed: the last chunk says stop and counts the same tokens", sdone and slast.usage
        and slast.choices[1].finish_reason == "stop" and slast.usage.completion_tokens == want,
        cjson.encode(slast))
    local ma = metrics(port)
    check("tinyloop_stop_string_finishes_total counts both stop-string endings",
        (ma.tinyloop_stop_string_finishes_total or 0) - (mb.tinyloop_stop_string_finishes_total or 0) == 2,
        cjson.encode({ mb.tinyloop_stop_string_finishes_total, ma.tinyloop_stop_string_finishes_total }))
    check("a stop string is not counted as a cancellation", (ma.tinyloop_requests_cancelled_total or 0)
        == (mb.tinyloop_requests_cancelled_total or 0))
    local mt = T.request(port, "GET", "/metrics") or { body = "" }
    check("the metrics' HELP texts say what they count",
        mt.body:find("# HELP tinyloop_stop_string_finishes_total Requests that ended at one of their stop strings",
            1, true) and mt.body:find("# HELP tinyloop_requests_cancelled_total Requests cancelled because the "
            .. "client went away", 1, true), mt.body:match("# HELP tinyloop_requests_cancelled[^\n]*"))
    local failed = {}
    for k, v in pairs(ma) do
        if k:find("^tinyloop_requests_failed_total{") and v > 0 then
            failed[k] = v
        end
    end
    check("the only failures counted are the two requests too large for KV", cjson.encode(failed)
        == cjson.encode({ ['tinyloop_requests_failed_total{endpoint="/v1/completions",reason="kv_capacity_exceeded"}']
            = 2 }), cjson.encode(failed))
    T.stop(srv)

    -- ---- the request timeout --------------------------------------------------------------
    -- A timeout of a microsecond: the first tokens go out, the next check of
    -- the deadline ends the request half-way through its 400 tokens.
    local tport = T.free_port()
    local tsrv, terr = T.start{ name = "timeout", conf = conf, port = tport, env = env("timeout"),
        subst = { { "init_worker%({ max_queue = 256 }%)",
            "init_worker({ max_queue = 256, request_timeout = 1e-6 })" } } }
    if check("an instance with a tiny request timeout starts", tsrv, terr) then
        -- the handler sees the deadline only after its first wait, which
        -- the first tokens end, and takes once more before it stops; a wake
        -- without news (the notifier's poll) could still end a try before
        -- any text, so such a stream is asked again (each try counts below)
        local t, ev, done, tries = nil, nil, nil, 0
        repeat
            tries = tries + 1
            t = T.post(tport, "/v1/completions", { prompt = "Once upon a time", max_tokens = 400,
                temperature = 0, stream = true }) or {}
            ev, done = T.sse(t.body or "")
        until tries == 5 or (t.status == 200 and #ev >= 2 and #T.sse_text(ev) > 0)
        local last = ev[#ev] or {}
        check("a stream that times out half-way sent text first", t.status == 200 and #ev >= 2
            and #T.sse_text(ev) > 0, t.body)
        check("it ends with an error event in the OpenAI shape and no [DONE]", not done and last.error
            and last.error.code == "request_timeout" and last.error.type == "server_error"
            and last.error.message:find("timed out", 1, true), cjson.encode(last))
        local none_stop = true
        for _, e in ipairs(ev) do
            if e.choices and e.choices[1].finish_reason ~= cjson.null and e.choices[1].finish_reason then
                none_stop = false
            end
        end
        check("no chunk claims a finish_reason", none_stop, t.body)
        local n = T.post(tport, "/v1/completions", { prompt = "Once upon a time", max_tokens = 400,
            temperature = 0 }) or {}
        check("without a stream the timeout is a 504 JSON error", n.status == 504 and n.json
            and n.json.error.code == "request_timeout", n.body)
        local mm = metrics(tport)
        check("both count as failed in /metrics, none as a success",
            mm['tinyloop_requests_failed_total{endpoint="/v1/completions",reason="request_timeout"}'] == tries + 1
            and mm['tinyloop_http_requests_total{endpoint="/v1/completions",status="504"}'] == tries + 1
            and mm['tinyloop_http_requests_total{endpoint="/v1/completions",status="200"}'] == nil,
            cjson.encode(mm))
        T.stop(tsrv)
    end
end)
if not ok_run then
    check("the endings tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
