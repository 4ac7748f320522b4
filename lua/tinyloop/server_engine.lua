-- tinyloop.server_engine - the engine thread seen from one nginx worker:
-- FFI wrappers over tl_engine_* and the non-blocking request calls, and the
-- notifier (one background timer per worker reading the engine's request
-- ids through a cosocket and waking the waiting handlers' semaphores).
--
--   local eng = require "tinyloop.server_engine"
--   local e = assert(eng.start(model, { max_queue = 256 }))   -- init_worker_by_lua
--   local id, err, rc = e:submit(ids, n, params)                -- in a handler
--   local sema = e:wait_handle(id)
--   local n, finished = e:take(id, buf, cap); sema:wait(1)
--   e:release(id)
--
-- A cosocket cannot wrap an existing descriptor, so the notifier connects a
-- cosocket to a unix socket this module listens on, accepts the other end,
-- and hands that end to the engine (tl_engine_notify_attach), which then
-- writes ids straight into the cosocket's peer. Lost ids (a full buffer)
-- are covered by a periodic poll of every waiter.
-- luacheck: globals ngx
local ffi = require "ffi"
local lib = require "tinyloop.lib"
local semaphore = require "ngx.semaphore"
local tier_stats = require("tinyloop").tier_stats

local C = lib.load()
local ffi_new, ffi_copy = ffi.new, ffi.copy
local tonumber, pairs, setmetatable, floor = tonumber, pairs, setmetatable, math.floor
local ngx_log, ERR, WARN, INFO = ngx.log, ngx.ERR, ngx.WARN, ngx.INFO

local _M = {}
local mt = { __index = _M }

-- The engine's status codes (ERR_BUSY, ERR_KV_FULL, ...) from the
-- generated enum, not copies of their values.
for name, v in pairs(lib.status) do
    _M[name] = v
end

pcall(ffi.cdef, [[
typedef struct tl_sockaddr_un { unsigned short sun_family; char sun_path[108]; } tl_sockaddr_un;
int socket(int domain, int type, int protocol);
int bind(int fd, const void *addr, unsigned int len);
int listen(int fd, int backlog);
int accept4(int fd, void *addr, void *len, int flags);
int close(int fd);
int unlink(const char *path);
int setsockopt(int fd, int level, int name, const void *val, unsigned int len);
int getpid(void);
]])

local AF_UNIX, SOCK_STREAM, SOCK_NONBLOCK, SOCK_CLOEXEC = 1, 1, 2048, 524288
local SOL_SOCKET, SO_SNDBUF = 1, 7

local id_out = ffi_new("int64_t[1]")
local finished = ffi_new("int[1]")
local info_buf = ffi_new("tl_request_info[1]")
local stats_buf = ffi_new("tl_cache_stats[1]")
-- The notifier's frame buffer: a receive (at most 65536 bytes) is copied
-- here rather than cast per tick (ffi.cast allocates a pointer cdata).
local NOTE_CAP = 8192
local notes = ffi_new("int64_t[?]", NOTE_CAP)
local STATS_KEYS = { "lookups", "hits", "hit_tokens", "prefill_tokens", "prefill_tokens_saved",
    "generated_tokens", "requests_finished", "evictions", "evicted_tokens", "nodes",
    "cached_tokens", "blocks_total", "blocks_free", "blocks_used", "blocks_shared",
    "requests_active", "requests_queued" }



local function listen_unix(path)
    local fd = ffi.C.socket(AF_UNIX, SOCK_STREAM + SOCK_CLOEXEC, 0)
    if fd < 0 then
        return nil, "socket() failed: " .. ffi.errno()
    end
    local sa = ffi_new("tl_sockaddr_un")
    sa.sun_family = AF_UNIX
    ffi_copy(sa.sun_path, path)
    ffi.C.unlink(path)
    if ffi.C.bind(fd, sa, ffi.sizeof(sa)) ~= 0 or ffi.C.listen(fd, 4) ~= 0 then
        local e = ffi.errno()
        ffi.C.close(fd)
        return nil, "cannot listen on " .. path .. ": errno " .. e
    end
    return fd
end


-- ---- the engine -----------------------------------------------------------------------

-- start(model, opts) -> engine | nil, err. model is a tinyloop.Model (its
-- handle is used; the Model keeps it alive). opts: max_queue, poll
-- (seconds between polls of every waiter; 0.5), sock_dir.
function _M.start(model, opts)
    opts = opts or {}
    local h = model.h
    local rc = C.tl_engine_start(h, opts.max_queue or 0)
    if rc ~= 0 then
        return nil, "tl_engine_start: " .. lib.last_error()
    end
    local self = setmetatable({
        model = model, h = h, waiters = {}, n_waiters = 0,
        poll = opts.poll or 0.5, wakeups = 0, notes = 0,
        sock_dir = opts.sock_dir or "/tmp", running = true,
    }, mt)
    local ok, err = ngx.timer.at(0, _M._notifier, self)
    if not ok then
        return nil, "cannot start the notifier timer: " .. tostring(err)
    end
    return self
end


-- Wires a cosocket to the engine's notifications; returns the cosocket.
function _M:connect_notify()
    local path = string.format("%s/tl-notify-%d-%d.sock", self.sock_dir, ffi.C.getpid(),
        math.random(1, 1e9))
    if #path > 100 then
        path = string.format("/tmp/tl-notify-%d-%d.sock", ffi.C.getpid(), math.random(1, 1e9))
    end
    local lfd, err = listen_unix(path)
    if not lfd then
        return nil, err
    end
    local sock = ngx.socket.tcp()
    local ok, cerr = sock:connect("unix:" .. path)
    local fd = ok and ffi.C.accept4(lfd, nil, nil, SOCK_NONBLOCK + SOCK_CLOEXEC) or -1
    ffi.C.close(lfd)
    ffi.C.unlink(path)
    if not ok or fd < 0 then
        return nil, "cannot connect the notify socket: " .. tostring(cerr or ffi.errno())
    end
    local sz = ffi_new("int[1]", 1048576)
    ffi.C.setsockopt(fd, SOL_SOCKET, SO_SNDBUF, sz, 4)
    local rc = C.tl_engine_notify_attach(self.h, fd)
    ffi.C.close(fd) -- the engine keeps its own dup
    if rc ~= 0 then
        return nil, "tl_engine_notify_attach: " .. lib.last_error()
    end
    self.notify_mode = "socket"
    return sock
end


function _M:wake(id)
    local s = self.waiters[id]
    if s and s:count() < 1 then
        s:post(1)
        self.wakeups = self.wakeups + 1
        return true
    end
    return s ~= nil
end


function _M:wake_all()
    for _, s in pairs(self.waiters) do
        if s:count() < 1 then
            s:post(1)
        end
    end
end


-- Whether the notifier has work: the engine runs, and the worker is not
-- exiting or still has requests in flight. On a reload (SIGHUP) the old
-- worker keeps serving its streams until they end; without the notifier
-- they would only be woken by their 1 s wait.
function _M:notifier_alive()
    return self.running and (self.n_waiters > 0 or not ngx.worker.exiting())
end


-- The background timer: reads ids (8 bytes each, host order), wakes their
-- waiters; on a read timeout wakes everyone (ids may have been dropped).
-- It reconnects in place after a socket error: in an exiting worker a new
-- timer would only run with premature = true.
function _M._notifier(premature, self)
    if premature and self.n_waiters == 0 or not self.running then
        return
    end
    local sock, err = self:connect_notify()
    if not sock then
        ngx_log(ERR, "tinyloop notifier: ", err, "; polling every ", self.poll, " s")
        self.notify_mode = "poll"
        while self:notifier_alive() do
            self:wake_all()
            ngx.sleep(0.005)
        end
        return
    end
    ngx_log(INFO, "tinyloop notifier: ", self.notify_mode)
    sock:settimeouts(1000, 1000, self.poll * 1000)
    local rest = ""
    while self:notifier_alive() do
        local data, rerr = sock:receiveany(65536)
        if data then
            if rest ~= "" then
                data = rest .. data
            end
            local n = floor(#data / 8)
            if n > NOTE_CAP then -- data = rest .. a receive: at most one frame more
                n = NOTE_CAP
            end
            ffi_copy(notes, data, n * 8)
            local unknown = false
            for i = 0, n - 1 do
                self.notes = self.notes + 1
                if not self:wake(tonumber(notes[i])) then
                    unknown = true
                end
            end
            rest = data:sub(n * 8 + 1)
            if unknown then
                -- a finished request already released, or a torn frame
                self:wake_all()
            end
        elseif rerr == "timeout" then
            self:wake_all()
        else
            ngx_log(WARN, "tinyloop notifier: ", rerr, "; reconnecting")
            sock:close()
            self:wake_all()
            ngx.sleep(0.01)
            sock = self:notifier_alive() and self:connect_notify()
            if not sock then
                return self:notifier_alive() and _M._notifier(false, self)
            end
            sock:settimeouts(1000, 1000, self.poll * 1000)
            rest = ""
        end
    end
    sock:close()
end


-- ---- requests ------------------------------------------------------------------------

-- submit(ids, n, params) -> id | nil, message, rc. params: a tl_generate_params cdata.
function _M:submit(ids, n, params)
    local rc = C.tl_request_submit(self.h, ids, n, params, nil, id_out)
    if rc ~= 0 then
        return nil, lib.last_error(), rc
    end
    local id = tonumber(id_out[0])
    self.waiters[id] = semaphore.new(0)
    self.n_waiters = self.n_waiters + 1
    return id
end


function _M:semaphore(id)
    return self.waiters[id]
end


-- take(id, buf, cap) -> n, finished | nil, message, rc
function _M:take(id, buf, cap)
    local n = C.tl_request_take(self.h, id, buf, cap, finished)
    if n < 0 then
        return nil, lib.last_error(), n
    end
    return n, finished[0] ~= 0
end


function _M:info(id)
    if C.tl_request_get_info(self.h, id, info_buf) ~= 0 then
        return nil, lib.last_error()
    end
    local i = info_buf[0]
    return {
        state = i.state, finish_reason = i.finish_reason, n_prompt = i.n_prompt,
        n_generated = i.n_generated, n_cached = i.n_cached, error = i.error,
    }
end


function _M:cancel(id)
    return C.tl_request_cancel(self.h, id)
end


function _M:release(id)
    if self.waiters[id] then
        self.waiters[id] = nil
        self.n_waiters = self.n_waiters - 1
    end
    return C.tl_request_release(self.h, id)
end


function _M:stats()
    if C.tl_model_get_stats(self.h, stats_buf) ~= 0 then
        return nil, lib.last_error()
    end
    local s = stats_buf[0]
    local t = {}
    for i = 1, #STATS_KEYS do
        local k = STATS_KEYS[i]
        t[k] = tonumber(s[k])
    end
    t.tiers = tier_stats(s) -- { host = {...}, disk = {...}, restored_tokens, recomputed }
    return t
end


function _M:stop()
    self.running = false
    C.tl_engine_stop(self.h)
end


-- ---- tokenization off the event loop -------------------------------------------------------

local job_out = ffi_new("int64_t[1]")
local n_out = ffi_new("int[1]")
local TL_ERR_BUFFER = -8


-- tokenize(what, opts) -> ids (int32_t cdata), n | nil, message, rc. what is a
-- text, or with opts.chat a list of { role, content } (rendered with the
-- model's template; only its markers become control tokens). opts:
-- add_special, parse_special (text). The job runs on the model's tokenizer
-- thread; this handler sleeps on its semaphore until the notifier (or the
-- poll) wakes it, so the event loop stays free. If the handler dies while
-- waiting, the job is released when its guard is collected.
function _M:tokenize(what, opts)
    opts = opts or {}
    local h = self.h
    local rc
    if opts.chat then
        local n = #what
        local arr = ffi_new("tl_chat_message[?]", n)
        for i = 1, n do
            arr[i - 1].role = what[i].role
            arr[i - 1].content = what[i].content
        end
        rc = C.tl_chat_tokenize_submit(h, arr, n, 1, job_out)
    else
        rc = C.tl_tokenize_submit(h, what, #what, opts.add_special == false and 0 or 1,
            opts.parse_special and 1 or 0, job_out)
    end
    if rc ~= 0 then
        return nil, lib.last_error(), rc
    end
    local id = tonumber(job_out[0])
    local waiters = self.waiters
    local sema = semaphore.new(0)
    waiters[id] = sema
    local guard = ffi.gc(ffi_new("char[1]"), function()
        waiters[id] = nil
        C.tl_tokenize_release(h, id)
    end)
    local ids, n, err
    while true do
        rc = C.tl_tokenize_take(h, id, nil, 0, n_out)
        n = n_out[0]
        if rc == TL_ERR_BUFFER then
            ids = ffi_new("int32_t[?]", n)
            rc = C.tl_tokenize_take(h, id, ids, n, n_out)
        end
        if rc ~= 0 then
            err = lib.last_error()
            break
        end
        if n >= 0 then
            ids = ids or ffi_new("int32_t[1]")
            break
        end
        sema:wait(self.poll)
    end
    ffi.gc(guard, nil) -- the job is gone (taken, or freed with its error)
    waiters[id] = nil
    if err then
        return nil, err, rc
    end
    return ids, n
end


return _M
