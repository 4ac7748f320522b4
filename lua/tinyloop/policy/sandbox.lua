-- The policy sandbox: a whitelisted environment and guarded calls under an
-- instruction limit (see tinyloop.policy).
local _M = {}

local type, pairs, tostring, error, pcall, select = type, pairs, tostring, error, pcall, select
local setmetatable, getmetatable, rawget, rawequal = setmetatable, getmetatable, rawget, rawequal
local format, concat = string.format, table.concat
local debug_sethook, debug_getmetatable = debug.sethook, debug.getmetatable

_M.DEFAULT_LIMIT = 2000000        -- VM instructions per guarded call
_M.LIMIT_MSG = "policy exceeded its instruction limit (infinite loop?)"
_M.MAX_STRING = 1048576           -- largest string a policy may build with string.rep


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


-- One guard at a time (a Lua state runs one thing at a time): expired is
-- set by the hook so the sandbox's pcall cannot swallow the limit.
local guard_depth, expired = 0, false

local function hook()
    expired = true
    error(_M.LIMIT_MSG, 0)
end


local function safe_rep(s, n, sep)
    s = tostring(s)
    n = tonumber(n) or 0
    local len = (#s + (sep and #tostring(sep) or 0)) * n
    if len > _M.MAX_STRING then
        error(format("string.rep result too large (%d bytes > %d)", len, _M.MAX_STRING), 2)
    end
    return string.rep(s, n, sep)
end


-- The string functions a policy sees, both as `string` and as methods on
-- string values while policy code runs (the string metatable's __index is
-- swapped to this read-only table for the duration of a guarded call, so
-- ("").rep is the capped one and nothing reachable from a string can be
-- modified). No string.dump.
local sandbox_string = copy(string)
sandbox_string.dump = nil
sandbox_string.rep = safe_rep
local frozen_string = freeze(sandbox_string, "string")
local string_mt = debug_getmetatable("")


local function re_raise(ok, ...)
    if not ok and expired then
        error(_M.LIMIT_MSG, 0)
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
        string = copy(sandbox_string), table = copy(table), math = copy(math), bit = copy(require "bit"),
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


local function finish_guard(prev_index, ok, ...)
    guard_depth = guard_depth - 1
    if guard_depth == 0 then
        debug_sethook()
        string_mt.__index = prev_index
        if not ok and expired then
            return false, _M.LIMIT_MSG
        end
    end
    return ok, ...
end


-- guarded(limit, f, ...) -> pcall(f, ...) under the instruction limit, with
-- string methods pointing at the sandbox's read-only string table.
function _M.guarded(limit, f, ...)
    local prev = string_mt.__index
    if guard_depth == 0 then
        expired = false
        string_mt.__index = frozen_string
        debug_sethook(hook, "", limit or _M.DEFAULT_LIMIT)
    end
    guard_depth = guard_depth + 1
    return finish_guard(prev, pcall(f, ...))
end



return _M
