-- Integration test support: start/stop real nginx processes under a temp
-- prefix on loopback ports, a small HTTP/1.1 client (blocking and many-at-once
-- over poll) with SSE parsing, and a check/summary counter. LuaJIT + luaposix
-- + cjson. Every wait is bounded in count and time.
local socket = require "posix.sys.socket"
local poll = require "posix.poll"
local unistd = require "posix.unistd"
local signal = require "posix.signal"
local ptime = require "posix.time"
local stdlib = require "posix.stdlib"
local cjson = require "cjson.safe"

local M = {}

M.ROOT = os.getenv("TINYLOOP_ROOT") or (function()
    local src = debug.getinfo(1, "S").source:sub(2)
    local dir = src:match("^(.*)/tests/integration/[^/]*$")
    if not dir or dir == "" then
        dir = "."
    end
    return dir
end)()
if M.ROOT:sub(1, 1) ~= "/" then
    M.ROOT = (os.getenv("PWD") or ".") .. "/" .. M.ROOT
end
M.SHARED = os.getenv("TINYLOOP_SHARED") or (M.ROOT .. "/../shared")
M.MODEL = os.getenv("TINYLOOP_TEST_MODEL") or (M.SHARED .. "/models/stories260K.gguf")


function M.now()
    local t = ptime.clock_gettime(ptime.CLOCK_MONOTONIC)
    return t.tv_sec + t.tv_nsec * 1e-9
end


function M.sleep(s)
    ptime.nanosleep({ tv_sec = math.floor(s), tv_nsec = math.floor((s % 1) * 1e9) })
end


-- ---- checks ------------------------------------------------------------------------------

M.passed, M.failed = 0, 0

function M.check(name, ok, detail)
    if ok then
        M.passed = M.passed + 1
        print("ok   " .. name)
    else
        M.failed = M.failed + 1
        print("FAIL " .. name .. (detail and ("  -- " .. tostring(detail)) or ""))
    end
    return ok
end


function M.skip(name, why)
    print("skip " .. name .. " (" .. why .. ")")
end


-- ---- processes ---------------------------------------------------------------------------

local tmp_root
local servers = {}

function M.tmpdir()
    if not tmp_root then
        tmp_root = assert(stdlib.mkdtemp((os.getenv("TMPDIR") or "/tmp") .. "/tl-integ.XXXXXX"))
        os.execute("chmod 755 " .. tmp_root)
    end
    return tmp_root
end


local function write(path, text)
    local f = assert(io.open(path, "w"))
    f:write(text)
    f:close()
end
M.write = write


local function read(path)
    local f = io.open(path, "r")
    if not f then
        return nil
    end
    local s = f:read("*a")
    f:close()
    return s
end
M.read = read


local function port_free(port)
    local fd = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    local ok = socket.connect(fd, { family = socket.AF_INET, addr = "127.0.0.1", port = port })
    unistd.close(fd)
    return not ok
end


local next_port = 20000 + (unistd.getpid() * 7) % 30000
function M.free_port()
    for _ = 1, 200 do
        next_port = next_port + 1
        if next_port > 60000 then
            next_port = 20000
        end
        if port_free(next_port) then
            return next_port
        end
    end
    error("no free port")
end


local function alive(pid)
    return pid and signal.kill(pid, 0) == 0
end
M.alive = alive


-- start{ name, conf = path of a template, port, env = { K = V }, subst = { {from, to} }, bare }
-- -> server { name, port, pid, prefix, env, user } | nil, err. Waits for /health (engine) or the port.
-- The prefix comes from tools/nginx_prefix.sh, which makes the checkout
-- readable by the workers from any directory (see there); env values that are
-- paths of files may come back staged.
function M.start(o)
    local prefix = M.tmpdir() .. "/" .. o.name
    os.execute(string.format("rm -rf '%s' && mkdir -p '%s'", prefix, prefix))
    local env = {}
    local args = {}
    for k, v in pairs(o.env or {}) do
        env[k] = tostring(v)
        if env[k]:sub(1, 1) == "/" then
            args[#args + 1] = string.format("'%s=%s'", k, env[k])
        end
    end
    -- bare: an installed tree (test_install.lua): the prefix gets logs/ and
    -- tmp/ only, and the conf names where the code is.
    local setup = prefix .. "/setup.out"
    local ok = os.execute(o.bare and string.format("mkdir -p '%s/logs' '%s/tmp' && chmod 755 '%s' >'%s'",
        prefix, prefix, prefix, setup)
        or string.format("sh '%s/tools/nginx_prefix.sh' '%s' '%s' %s >'%s'",
            M.ROOT, M.ROOT, prefix, table.concat(args, " "), setup))
    if not (ok == true or ok == 0) then
        return nil, "nginx_prefix.sh failed for " .. prefix
    end
    local user_line = ""
    for line in (read(setup) or ""):gmatch("[^\n]+") do
        local u = line:match("^user (.+)$")
        local k, v = line:match("^([%w_]+)=(.*)$")
        if u then
            user_line = "user " .. u .. ";\n"
        elseif k then
            env[k] = v
        end
    end
    local conf = user_line .. assert(read(o.conf))
    conf = conf:gsub("listen 127%.0%.0%.1:%d+", "listen 127.0.0.1:" .. o.port, 1)
    for _, s in ipairs(o.subst or {}) do
        conf = conf:gsub(s[1], s[2])
    end
    write(prefix .. "/nginx.conf", conf)
    local envs = {}
    for k, v in pairs(env) do
        envs[#envs + 1] = string.format("%s='%s'", k, v)
    end
    local cmd = string.format("env %s nginx -p '%s' -c '%s/nginx.conf' >'%s/logs/start.log' 2>&1",
        table.concat(envs, " "), prefix, prefix, prefix)
    if not os.execute(cmd) then
        return nil, "nginx failed to start: " .. (read(prefix .. "/logs/start.log") or "")
    end
    local pid
    for _ = 1, 100 do
        pid = tonumber(read(prefix .. "/logs/nginx.pid") or "")
        if pid then
            break
        end
        M.sleep(0.05)
    end
    if not pid then
        return nil, "no pid file in " .. prefix
    end
    local srv = { name = o.name, port = o.port, pid = pid, prefix = prefix, env = env, user = user_line }
    servers[#servers + 1] = srv
    local path = o.health or "/health"
    local deadline = M.now() + 20
    while M.now() < deadline do
        local st = M.request(o.port, "GET", path, nil, nil, 2)
        if st and st.status == 200 then
            return srv
        end
        M.sleep(0.05)
    end
    return nil, "no answer on " .. path .. ": " .. (read(prefix .. "/logs/error.log") or "")
end


-- Stops a server by its master pid (QUIT, then TERM, then KILL), bounded;
-- true once the process is gone.
function M.stop(srv, fast)
    if not srv or not srv.pid then
        return
    end
    local pid = srv.pid
    signal.kill(pid, fast and signal.SIGTERM or signal.SIGQUIT)
    for i = 1, 100 do
        if not alive(pid) then
            break
        end
        if i == 60 then
            signal.kill(pid, signal.SIGKILL)
        end
        M.sleep(0.05)
    end
    srv.pid = nil
    return not alive(pid)
end


function M.stop_all()
    for _, s in ipairs(servers) do
        M.stop(s)
    end
    if tmp_root and os.getenv("TINYLOOP_KEEP_TMP") ~= "1" then
        os.execute("rm -rf '" .. tmp_root .. "'")
    end
end


function M.error_log(srv)
    return read(srv.prefix .. "/logs/error.log") or ""
end


-- ---- HTTP ------------------------------------------------------------------------------------

local function build(method, path, body, headers)
    local h = { string.format("%s %s HTTP/1.1", method, path), "Host: 127.0.0.1", "Connection: close" }
    for k, v in pairs(headers or {}) do
        h[#h + 1] = k .. ": " .. v
    end
    if body then
        h[#h + 1] = "Content-Type: application/json"
        h[#h + 1] = "Content-Length: " .. #body
    end
    return table.concat(h, "\r\n") .. "\r\n\r\n" .. (body or "")
end


local function dechunk(s)
    local out, pos = {}, 1
    while true do
        local a, b, hex = s:find("^(%x+)[^\r\n]*\r\n", pos)
        if not a then
            break
        end
        local n = tonumber(hex, 16)
        if n == 0 then
            break
        end
        out[#out + 1] = s:sub(b + 1, b + n)
        pos = b + n + 3
    end
    return table.concat(out)
end


-- Parses a raw response -> { status, headers (lower-case), body, json }.
local function parse(raw)
    local head, body = raw:match("^(.-)\r\n\r\n(.*)$")
    if not head then
        return nil
    end
    local status = tonumber(head:match("^HTTP/1%.%d (%d+)"))
    local headers = {}
    for k, v in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do
        headers[k:lower()] = v
    end
    if (headers["transfer-encoding"] or ""):lower():find("chunked") then
        body = dechunk(body)
    end
    return { status = status, headers = headers, body = body, json = cjson.decode(body) }
end
M.parse = parse


local function connect(port)
    local fd = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    local ok, err = socket.connect(fd, { family = socket.AF_INET, addr = "127.0.0.1", port = port })
    if not ok then
        unistd.close(fd)
        return nil, err
    end
    return fd
end


-- request(port, method, path, body, headers, timeout) -> response | nil, err
function M.request(port, method, path, body, headers, timeout)
    local fd, err = connect(port)
    if not fd then
        return nil, err
    end
    local req = build(method, path, body, headers)
    local sent = 0
    while sent < #req do
        local n = socket.send(fd, req:sub(sent + 1))
        if not n then
            break -- the server may answer (413) before taking the whole body
        end
        sent = sent + n
    end
    local parts = {}
    local deadline = M.now() + (timeout or 30)
    while M.now() < deadline do
        local r = poll.rpoll(fd, 100)
        if r and r > 0 then
            local data = socket.recv(fd, 65536)
            if not data or data == "" then
                break
            end
            parts[#parts + 1] = data
        end
    end
    unistd.close(fd)
    local res = parse(table.concat(parts))
    if not res then
        return nil, "no response"
    end
    return res
end


function M.post(port, path, obj, headers, timeout)
    return M.request(port, "POST", path, type(obj) == "string" and obj or cjson.encode(obj), headers, timeout)
end


-- SSE: "data: {...}" events -> list of decoded objects, and whether [DONE] came.
function M.sse(body)
    local events, done = {}, false
    for line in body:gmatch("[^\n]+") do
        local d = line:match("^data: (.*)$")
        if d == "[DONE]" then
            done = true
        elseif d then
            events[#events + 1] = cjson.decode(d)
        end
    end
    return events, done
end


-- Concatenated text of SSE events (completions or chat).
function M.sse_text(events)
    local out = {}
    for _, e in ipairs(events) do
        local c = e and e.choices and e.choices[1]
        if c then
            out[#out + 1] = c.text or (c.delta and c.delta.content) or ""
        end
    end
    return table.concat(out)
end


-- many(reqs, opts) runs requests concurrently over poll. reqs[i] = { port, method,
-- path, body, headers, close_after_first = bool, at = seconds after start }.
-- Returns results[i] = { res, t_first (first body byte), t_done, err } and
-- calls opts.on_tick(now, state) each loop. Bounded by opts.timeout.
function M.many(reqs, opts)
    opts = opts or {}
    local t0 = M.now()
    local deadline = t0 + (opts.timeout or 60)
    local st = {}
    local open = 0
    for i, r in ipairs(reqs) do
        st[i] = { r = r, parts = {}, started = false, done = false }
    end
    local remaining = #reqs
    while remaining > 0 and M.now() < deadline do
        local now = M.now()
        for _, s in ipairs(st) do
            if not s.started and now - t0 >= (s.r.at or 0) then
                s.started = true
                s.t_start = now
                local fd, err = connect(s.r.port)
                if not fd then
                    s.done, s.err = true, err
                    remaining = remaining - 1
                else
                    s.fd = fd
                    open = open + 1
                    local body = s.r.body
                    if type(body) == "table" then
                        body = cjson.encode(body)
                    end
                    socket.send(fd, build(s.r.method or "POST", s.r.path, body, s.r.headers))
                end
            end
        end
        local fds, map = {}, {}
        for _, s in ipairs(st) do
            if s.fd and not s.done then
                fds[s.fd] = { events = { IN = true } }
                map[s.fd] = s
            end
        end
        if next(fds) then
            poll.poll(fds, 20)
            for fd, p in pairs(fds) do
                local s = map[fd]
                if p.revents and (p.revents.IN or p.revents.HUP or p.revents.ERR) then
                    local data = socket.recv(fd, 65536)
                    if data and data ~= "" then
                        s.parts[#s.parts + 1] = data
                        if not s.t_first then
                            local all = table.concat(s.parts)
                            if all:find("\r\n\r\n") and (all:find("data: ", 1, true) or
                                not all:find("text/event-stream", 1, true)) then
                                s.t_first = M.now() - s.t_start
                                if s.r.close_after_first then
                                    data = nil
                                end
                            end
                        end
                    end
                    if not data or data == "" then
                        unistd.close(fd)
                        s.fd = nil
                        s.done = true
                        s.t_done = M.now() - s.t_start
                        s.res = parse(table.concat(s.parts))
                        remaining = remaining - 1
                    end
                end
            end
        else
            M.sleep(0.005)
        end
        if opts.on_tick then
            opts.on_tick(M.now() - t0, st)
        end
    end
    for _, s in ipairs(st) do
        if s.fd then
            unistd.close(s.fd)
            s.err = "timeout"
        end
    end
    return st
end


-- Prometheus text -> { ["name{labels}"] = value }, list of malformed lines.
function M.prom(text)
    local v, bad = {}, {}
    for line in text:gmatch("[^\n]+") do
        if not line:match("^#") then
            local k, val = line:match("^([%a_:][%w_:]*%b{}) (%S+)$")
            if not k then
                k, val = line:match("^([%a_:][%w_:]*) (%S+)$")
            end
            if k and tonumber(val) then
                v[k] = tonumber(val)
            else
                bad[#bad + 1] = line
            end
        elseif not (line:match("^# HELP [%a_:][%w_:]* ") or line:match("^# TYPE [%a_:][%w_:]* %a+$")) then
            bad[#bad + 1] = line
        end
    end
    return v, bad
end


function M.summary()
    print(string.format("%d passed, %d failed", M.passed, M.failed))
    return M.failed == 0
end


return M
