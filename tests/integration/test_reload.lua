-- Reloads and restarts (issue 15, item 13), real nginx with stories260K:
-- a stream in flight when nginx reloads (SIGHUP) keeps its pace in the old
-- worker (the notifier keeps running until the last request drains, then
-- the worker exits), and a worker whose model file is missing answers 503
-- with the reason in /health, retries with backoff, and serves once the
-- file appears.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local cjson = require "cjson.safe"
local socket = require "posix.sys.socket"
local poll = require "posix.poll"
local unistd = require "posix.unistd"
local signal = require "posix.signal"
local check = T.check

local conf = T.ROOT .. "/examples/nginx.conf"


-- Worker pids of a master (its children, from /proc).
local function workers(master)
    local out = {}
    local p = io.popen("ls /proc")
    for name in p:lines() do
        local pid = tonumber(name)
        if pid then
            local stat = T.read("/proc/" .. pid .. "/stat")
            local ppid = stat and tonumber(stat:match("^%d+ %b() %S+ (%d+)"))
            if ppid == master then
                out[#out + 1] = pid
            end
        end
    end
    p:close()
    return out
end


-- Streams one completion, calling on_event(n_events, now) after each SSE
-- event; returns { times = { t of each event }, done, usage, text, err }.
local function stream(port, body, on_event, timeout)
    local fd = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    local ok, err = socket.connect(fd, { family = socket.AF_INET, addr = "127.0.0.1", port = port })
    if not ok then
        unistd.close(fd)
        return { times = {}, err = err }
    end
    local js = cjson.encode(body)
    socket.send(fd, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        .. "Content-Type: application/json\r\nContent-Length: " .. #js .. "\r\n\r\n" .. js)
    local res = { times = {}, done = false }
    local buf, parts = "", {}
    local deadline = T.now() + timeout
    while T.now() < deadline do
        local r = poll.rpoll(fd, 50)
        if r and r > 0 then
            local data = socket.recv(fd, 65536)
            if not data or data == "" then
                break
            end
            local now = T.now()
            buf = buf .. data
            for line in buf:gmatch("data: ([^\n]*)\n") do
                if line == "[DONE]" then
                    res.done = true
                else
                    local ev = cjson.decode(line)
                    if ev then
                        res.times[#res.times + 1] = now
                        parts[#parts + 1] = ev.choices and ev.choices[1] and ev.choices[1].text or ""
                        res.usage = ev.usage or res.usage
                        if on_event then
                            on_event(#res.times, now)
                        end
                    end
                end
            end
            buf = buf:match("^.*\n(.-)$") or buf -- keep an incomplete line
        end
    end
    unistd.close(fd)
    res.text = table.concat(parts)
    return res
end


local ok_run, run_err = pcall(function()
    -- ---- a stream across a reload ------------------------------------------------------
    local port = T.free_port()
    local srv, err = T.start{ name = "reload", conf = conf, port = port, env = {
        TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 2048, TINYLOOP_INSTANCE = "reload" } }
    if not check("an engine instance starts", srv, err) then
        return
    end
    local old = workers(srv.pid)
    check("one worker before the reload", #old == 1, #old)
    local N = 1500 -- greedy stories260K runs to max_tokens without an end of text
    local t_reload, n_at_reload
    local res = stream(port, { prompt = "Once upon a time", max_tokens = N, temperature = 0, stream = true },
        function(n, now)
            if not t_reload and n >= 100 then
                t_reload, n_at_reload = now, n
                signal.kill(srv.pid, signal.SIGHUP) -- nginx -s reload
            end
        end, 180)
    local times = res.times
    check("the stream in flight across the reload ends with [DONE]", res.done, res.err)
    check("it delivers all its tokens", res.usage and res.usage.completion_tokens == N, cjson.encode(res.usage))
    if t_reload and #times > n_at_reload + 10 then
        local before = (n_at_reload - 1) / (t_reload - times[1])
        local after = (#times - n_at_reload) / (times[#times] - t_reload)
        local gap = 0
        for i = n_at_reload + 1, #times do
            gap = math.max(gap, times[i] - times[i - 1])
        end
        print(string.format("  events/s before the reload %.0f, after %.0f; longest gap after %.0f ms; "
            .. "%d events in %.2f s", before, after, gap * 1e3, #times, times[#times] - times[1]))
        -- the old worker's fallback (no notifier) wakes a handler once a second
        check("the stream keeps its pace after the reload (events/s not below a tenth of before)",
            after >= before / 10, string.format("%.1f vs %.1f", after, before))
    else
        check("the stream ran long enough past the reload to measure", false, #times)
    end
    local gone = false
    for _ = 1, 200 do
        if not T.alive(old[1]) then
            gone = true
            break
        end
        T.sleep(0.05)
    end
    check("the old worker exits once its last stream drained", gone, old[1])
    local new = workers(srv.pid)
    check("a new worker replaced it", #new == 1 and new[1] ~= old[1], cjson.encode(new))
    local r = T.post(port, "/v1/completions", { prompt = "Once", max_tokens = 8, temperature = 0 })
    check("the new worker serves requests", r and r.status == 200, r and r.body)
    T.stop(srv)

    -- ---- a model that appears after start ------------------------------------------------
    local late = T.tmpdir() .. "/late-model.gguf"
    os.remove(late)
    port = T.free_port()
    -- /v1/models answers without an engine: the server is up, the model is not
    srv, err = T.start{ name = "late", conf = conf, port = port, health = "/v1/models", env = {
        TINYLOOP_MODEL = late, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = "late",
        TINYLOOP_METRICS_KEY = "ops-key" } }
    if not check("an instance whose model file is missing starts", srv, err) then
        return
    end
    local h = T.request(port, "GET", "/health")
    check("/health without the metrics key: 503 and nothing but the status", h and h.status == 503
        and h.json and h.json.reason == nil and h.json.status == "unavailable", h and h.body)
    h = T.request(port, "GET", "/health", nil, { Authorization = "Bearer ops-key" })
    local j = h and h.json or {}
    print("  /health while missing: " .. tostring(h and h.body))
    check("/health answers 503 while the model is missing", h and h.status == 503, h and h.body)
    check("/health says why and when it retries", type(j.reason) == "string"
        and j.reason:find("late-model.gguf", 1, true) and type(j.retry_in) == "number" and j.retry_in >= 0,
        h and h.body)
    local c = T.post(port, "/v1/completions", { prompt = "Once", max_tokens = 4 })
    check("a completion is refused with 503 and Retry-After meanwhile", c and c.status == 503
        and c.headers["retry-after"], c and c.body)
    -- A copy, not a link: nginx's workers (nobody) may not traverse the
    -- checkout's folders (a mode 0700 clone); renamed into place whole, so a
    -- retry never sees half a file.
    os.execute(string.format("cp '%s' '%s.part' && chmod 644 '%s.part' && mv '%s.part' '%s'", T.MODEL, late,
        late, late, late))
    local t0, up = T.now(), false
    while T.now() - t0 < 45 do
        h = T.request(port, "GET", "/health")
        if h and h.status == 200 then
            up = true
            break
        end
        T.sleep(0.2)
    end
    print(string.format("  /health turned 200 %.1f s after the model file appeared", T.now() - t0))
    check("the worker loads the model once the file appears (retry with backoff)", up, h and h.body)
    r = T.post(port, "/v1/completions", { prompt = "Once", max_tokens = 8, temperature = 0 })
    check("and then serves completions", r and r.status == 200, r and r.body)
    check("the error log names the failed load and the retry",
        T.error_log(srv):find("late-model.gguf", 1, true) ~= nil and T.error_log(srv):find("retry", 1, true) ~= nil)
end)
if not ok_run then
    check("the reload tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
