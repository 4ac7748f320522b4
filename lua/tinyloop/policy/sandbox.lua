-- The policy sandbox: a whitelisted environment and guarded calls under an
-- instruction limit, a memory cap and a time budget (see tinyloop.policy).
--
-- The count hook is the only thing that interrupts policy code, and it
-- fires only in interpreted Lua: the policy's functions run with the JIT off
-- (tinyloop.policy), and every library function that could run long inside
-- C is replaced by a bounded one (patterns: tinyloop.policy.patterns; the
-- string builders below check the size of what they would build first).
-- Every STEP instructions the hook counts, checks the Lua heap against the
-- memory cap and, every few ticks, the clock against the call's deadline.
-- Known gap: one `..` bytecode can join up to ~200 strings before the next
-- tick sees the memory; the cap is then enforced one tick late.
--
-- What crosses the boundary is plain data: arguments are copied in (no
-- metatables), results are copied out with next/rawget and refused when
-- they hold a metatable, a function or a cycle, and an error is turned into
-- a string inside the guard, so no metamethod of the policy's ever runs in
-- host code without the limits.
local jit = require "jit"
local patterns = require "tinyloop.policy.patterns"

local _M = {}

local type, pairs, tostring, tonumber, error, pcall, xpcall, select =
    type, pairs, tostring, tonumber, error, pcall, xpcall, select
local setmetatable, getmetatable, rawget, rawequal, next = setmetatable, getmetatable, rawget, rawequal, next
local format, concat, rep, sort, sub = string.format, table.concat, string.rep, table.sort, string.sub
local debug_sethook, debug_getmetatable, debug_getinfo = debug.sethook, debug.getmetatable, debug.getinfo
local gc, huge = collectgarbage, math.huge

_M.DEFAULT_LIMIT = 2000000        -- VM instructions per guarded call
_M.LIMIT_MSG = "policy exceeded its instruction limit (infinite loop?)"
_M.MAX_STRING = 1048576           -- largest string a library function builds for a policy
_M.MAX_MEMORY = 32 * 1048576      -- bytes a guarded call may add to the Lua heap
_M.CALL_MS = 250                  -- wall-clock budget of one guarded call
_M.LOAD_MS = 2000                 -- wall-clock budget of a whole load (chunk, self_test, contract)
_M.MAX_SORT = 100000              -- table.sort without a comparator runs in C
_M.MAX_ITEMS = 100000             -- values in one policy result
_M.MAX_DEPTH = 32                 -- nesting of one policy result
_M.MAX_ERROR = 4096               -- bytes of a policy's error message kept
local STEP = 8                    -- instructions between hook ticks
local CLOCK_EVERY = 8             -- ticks between clock reads
patterns.MAX_STRING = _M.MAX_STRING


local now_ms
do
    local ok_ffi, ffi = pcall(require, "ffi")
    local ok = ok_ffi and pcall(ffi.cdef, [[
        struct tl_policy_timespec { long tv_sec; long tv_nsec; };
        int clock_gettime(int clk, struct tl_policy_timespec *ts);
    ]])
    if ok then
        local ts = ffi.new("struct tl_policy_timespec")
        if pcall(function() return ffi.C.clock_gettime(1, ts) end) then
            now_ms = function()
                ffi.C.clock_gettime(1, ts)
                return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
            end
        end
    end
    now_ms = now_ms or function()
        return os.clock() * 1000
    end
end
_M.now_ms = now_ms


local function copy(t)
    local c = {}
    for k, v in pairs(t) do
        c[k] = v
    end
    return c
end


local function freeze(t, name)
    return setmetatable({}, {
        __index = t,
        __newindex = function(_, k)
            error(format("attempt to modify %s.%s (read-only)", name, tostring(k)), 2)
        end,
        __metatable = false,
    })
end


-- One guard at a time (a Lua state runs one thing at a time). The hook's
-- state: instructions left, the heap size at the start, the deadline, and
-- expired (the reason, once a limit is hit) so the sandbox's pcall cannot
-- swallow the limit.
local guard_depth, expired = 0, false
local left, mem_base_kb, deadline, budget_ms, ticks = 0, 0, huge, 0, 0
local load_deadline = huge      -- set by within() for a whole load


-- The hook raises only in code run for the policy: its chunks (see
-- interruptible()) and the pattern matcher. Host code that runs meanwhile
-- (a finalizer the GC calls, the guard's own bookkeeping) is never cut
-- short; the hook raises once policy code runs again (expired keeps it
-- failing until the guard ends).
local interruptible = {
    [debug_getinfo(patterns.find, "S").source] = true,
}


function _M.interruptible(source)
    interruptible[source] = true
end


local function expire(msg)
    expired = expired or msg
    left = 0
    local info = debug_getinfo(3, "S")      -- 1: expire, 2: hook, 3: the code it interrupted
    if info and interruptible[info.source] then
        error(expired, 0)
    end
end


local function hook()
    if expired then
        expire(expired)
        return
    end
    left = left - STEP
    if left <= 0 then
        expire(_M.LIMIT_MSG)
        return
    end
    if gc("count") - mem_base_kb > _M.MAX_MEMORY / 1024 then
        gc()                  -- garbage counts too: judge what is live
        if gc("count") - mem_base_kb > _M.MAX_MEMORY / 1024 then
            expire(format("policy exceeded its memory limit (%d MB)", _M.MAX_MEMORY / 1048576))
            return
        end
    end
    ticks = ticks + 1
    if ticks % CLOCK_EVERY == 0 and now_ms() > deadline then
        expire(format("policy exceeded its time limit (%d ms)", budget_ms))
    end
end


-- charge(n): work done in C on the policy's behalf, counted as n instructions.
local function charge(n)
    if guard_depth > 0 then
        left = left - n
        if left <= 0 then
            expired = expired or _M.LIMIT_MSG
            error(expired, 0)
        end
    end
end


patterns.charge = charge


local function too_large(what, len)
    error(format("%s result too large (%d bytes > %d)", what, len, _M.MAX_STRING), 3)
end


local function safe_rep(s, n, sep)
    s = tostring(s)
    n = tonumber(n) or 0
    local len = (#s + (sep and #tostring(sep) or 0)) * n
    if len > _M.MAX_STRING or n > _M.MAX_STRING then
        too_large("string.rep", len)
    end
    charge(len / 64)
    return rep(s, n, sep)
end


local function safe_concat(t, sep, i, j)
    if type(t) ~= "table" then
        return concat(t, sep, i, j)      -- the usual error
    end
    local from, to = tonumber(i) or 1, tonumber(j) or #t
    local seplen = type(sep) == "string" and #sep or (type(sep) == "number" and #tostring(sep) or 0)
    local len = 0
    for k = from, to do
        local v = rawget(t, k)
        local tv = type(v)
        if tv == "string" then
            len = len + #v + seplen
        elseif tv == "number" then
            len = len + 24 + seplen
        else
            break            -- concat raises the usual error at this index
        end
        if len > _M.MAX_STRING then
            too_large("table.concat", len)
        end
    end
    return concat(t, sep, i, j)
end


local function safe_format(fmt, ...)
    if type(fmt) ~= "string" then
        return format(fmt, ...)
    end
    local len = #fmt
    local each = patterns.find(fmt, "%q", 1, true) and 4 or 1   -- %q writes a byte as up to 4
    for k = 1, select("#", ...) do
        local v = select(k, ...)
        len = len + (type(v) == "string" and #v * each or 32) + 100  -- width, precision <= 99
        if len > _M.MAX_STRING then
            too_large("string.format", len)
        end
    end
    return format(fmt, ...)
end


local function safe_sort(t, comp)
    if type(t) == "table" then
        if comp == nil and #t > _M.MAX_SORT then
            error(format("table.sort of %d values without a comparator (limit %d)", #t, _M.MAX_SORT), 2)
        end
        charge(#t)
    end
    return sort(t, comp)
end


-- The string functions a policy sees, both as `string` and as methods on
-- string values while policy code runs (the string metatable's __index is
-- swapped to this read-only table for the duration of a guarded call, so
-- ("").rep and ("").find are the bounded ones and nothing reachable from a
-- string can be modified). No string.dump.
local sandbox_string = copy(string)
sandbox_string.dump = nil
sandbox_string.rep, sandbox_string.format = safe_rep, safe_format
sandbox_string.find, sandbox_string.match = patterns.find, patterns.match
sandbox_string.gmatch, sandbox_string.gsub = patterns.gmatch, patterns.gsub
local frozen_string = freeze(sandbox_string, "string")
local string_mt = debug_getmetatable("")
local sandbox_table = copy(table)
sandbox_table.concat, sandbox_table.sort = safe_concat, safe_sort
for _, f in ipairs { safe_rep, safe_concat, safe_format, safe_sort } do
    jit.off(f, true)      -- their loops count as the policy's instructions
end


local function re_raise(ok, ...)
    if not ok and expired then
        error(expired, 0)
    end
    return ok, ...
end


local function safe_pcall(f, ...)
    return re_raise(pcall(f, ...))
end


local function safe_xpcall(f, handler)
    return re_raise(xpcall(f, handler))
end


local function safe_getmetatable(x)
    if type(x) ~= "table" then
        return nil
    end
    return getmetatable(x)
end


local function safe_setmetatable(t, mt)
    if type(t) ~= "table" then
        error("bad argument #1 to 'setmetatable' (table expected)", 2)
    end
    return setmetatable(t, mt)
end


-- new_env(log) -> a fresh environment for one load: nothing in it is shared
-- with the runtime or another version (string/table/math/bit are copies).
function _M.new_env(log)
    local env = {
        assert = assert, error = error, ipairs = ipairs, next = next, pairs = pairs,
        pcall = safe_pcall, xpcall = safe_xpcall, select = select, tonumber = tonumber,
        tostring = tostring, type = type, unpack = unpack, rawget = rawget, rawequal = rawequal,
        getmetatable = safe_getmetatable, setmetatable = safe_setmetatable,
        string = copy(sandbox_string), table = copy(sandbox_table), math = copy(math), bit = copy(require "bit"),
        print = function(...)
            local t = {}
            for i = 1, select("#", ...) do
                t[i] = tostring((select(i, ...)))
            end
            if log then
                log(concat(t, "\t"))
            end
        end,
    }
    env.math.randomseed = nil     -- would reseed the process-wide generator
    env._G = env
    return env
end


-- error_message(e) -> the policy's error as a string. Runs inside the
-- guard (an xpcall handler), so a __tostring of the policy's is limited.
local function error_message(e)
    if type(e) ~= "string" then
        local ok, s = pcall(tostring, e)
        e = (ok and type(s) == "string") and s or "(error object is a " .. type(e) .. " value)"
    end
    if #e > _M.MAX_ERROR then
        e = sub(e, 1, _M.MAX_ERROR) .. "..."
    end
    return e
end


local function finish_guard(prev_index, ok, ...)
    guard_depth = guard_depth - 1
    if guard_depth == 0 then
        debug_sethook()
        string_mt.__index = prev_index
        if not ok and expired then
            return false, expired
        end
    end
    if not ok then
        return false, (...)     -- a string: error_message ran in the guard
    end
    return ok, ...
end


-- guarded(limit, f, ...) -> ok, results... | false, message: f(...) under
-- the instruction limit, the memory cap and the time budget (CALL_MS, or
-- what is left of a load's budget), with string methods pointing at the
-- sandbox's read-only string table. The message is always a string.
function _M.guarded(limit, f, ...)
    local prev = string_mt.__index
    if guard_depth == 0 then
        expired = false
        left = limit or _M.DEFAULT_LIMIT
        ticks = 0
        mem_base_kb = gc("count")
        local now = now_ms()
        deadline = math.min(now + _M.CALL_MS, load_deadline)
        budget_ms = deadline - now
        string_mt.__index = frozen_string
        debug_sethook(hook, "", STEP)
    end
    guard_depth = guard_depth + 1
    return finish_guard(prev, xpcall(f, error_message, ...))
end


-- within(ms, f, ...) -> f(...) with every guarded call inside it sharing
-- one deadline ms from now (a load: chunk, self_test, contract checks), so
-- a policy that is slow at load cannot hold a starting worker for long.
function _M.within(ms, f, ...)
    local prev = load_deadline
    load_deadline = math.min(prev, now_ms() + (ms or _M.LOAD_MS))
    local res = { pcall(f, ...) }
    load_deadline = prev
    if not res[1] then
        error(res[2], 0)
    end
    return unpack(res, 2, table.maxn(res))
end


-- ---- plain data across the boundary -----------------------------------------------------------

-- copy_in(x, back) -> x for the policy: tables copied without their
-- metatables (cycles kept); back[copy] = original, so a result that is one
-- of the copies maps back to the caller's own table.
function _M.copy_in(x, back, seen)
    if type(x) ~= "table" then
        return x
    end
    seen = seen or {}
    local c = seen[x]
    if c then
        return c
    end
    c = {}
    seen[x] = c
    if back then
        back[c] = x
    end
    local k, v = next(x)
    while k ~= nil do
        c[_M.copy_in(k, back, seen)] = _M.copy_in(v, back, seen)
        k, v = next(x, k)
    end
    return c
end


local KEY_TYPES = { string = true, number = true, boolean = true }
local VALUE_TYPES = { string = true, number = true, boolean = true, ["nil"] = true }


local function plain_rec(x, st, depth, allow_fn)
    local tx = type(x)
    if tx ~= "table" then
        if VALUE_TYPES[tx] or (allow_fn and tx == "function") then
            return x
        end
        error("a " .. tx, 0)
    end
    local orig = st.back and st.back[x]
    if orig then
        return orig
    end
    if debug_getmetatable(x) ~= nil then
        error("a table with a metatable", 0)
    end
    if st.open[x] then
        error("a table that contains itself", 0)
    end
    if depth > _M.MAX_DEPTH then
        error("tables nested deeper than " .. _M.MAX_DEPTH, 0)
    end
    st.open[x] = true
    local c = {}
    local k, v = next(x)
    while k ~= nil do
        st.items = st.items + 1
        if st.items > _M.MAX_ITEMS then
            error("more than " .. _M.MAX_ITEMS .. " values", 0)
        end
        if not KEY_TYPES[type(k)] then
            error("a table key of type " .. type(k), 0)
        end
        c[k] = plain_rec(v, st, depth + 1, allow_fn)
        k, v = next(x, k)
    end
    st.open[x] = nil
    return c
end


-- plain(x, back, allow_fn) -> a copy of x made of strings, numbers,
-- booleans and tables without metatables (functions too when allow_fn),
-- or nil, the reason. Reads with next() only: no metamethod runs.
function _M.plain(x, back, allow_fn)
    local ok, c = pcall(plain_rec, x, { back = back, open = {}, items = 0 }, 1, allow_fn)
    if not ok then
        return nil, tostring(c)
    end
    return c
end



return _M
