-- tinyloop.args - argument checks and error messages shared by the
-- tinyloop modules: misuse raises error(msg, level) naming the argument and
-- its value; runtime errors keep the messages of docs/prefix-pool.md.
local lib = require "tinyloop.lib"

local type, tostring, error, next, ipairs = type, tostring, error, next, ipairs
local floor, format = math.floor, string.format

local _M = {}
local INT_MAX = 2147483647
local S = lib.status

-- The generation defaults of both the library (Model:generate and
-- friends) and the server (an OpenAI request that leaves them out): one
-- table (docs/prefix-pool.md's max_tokens 128, temperature 1.0, top_k 50;
-- the rest as tl_generate_default_params()). Two server differences are
-- OpenAI's, not other defaults: an unset max_tokens is 16 for completions
-- and the cap for chat, and an unset seed is random per request (the
-- library's is 0: reproducible).
_M.SAMPLING = {
    max_tokens = 128, temperature = 1.0, top_k = 50, top_p = 1.0, min_p = 0.0,
    repeat_penalty = 1.0, repeat_last_n = 64, seed = 0,
}


-- fill_sampling(s, o): a tl_sampling_params from o's temperature, top_k,
-- top_p (checked by the caller), the rest from SAMPLING; top_k is off at
-- temperature 0 unless given (greedy ignores it). The server's path; the
-- library's fill_params reads the same table for what the caller omits.
function _M.fill_sampling(s, o)
    local d = _M.SAMPLING
    local t = o.temperature or d.temperature
    s.temperature = t
    s.top_k = o.top_k or (t > 0 and d.top_k or 0)
    s.top_p = o.top_p or d.top_p
    s.min_p = o.min_p or d.min_p
    s.repeat_penalty = o.repeat_penalty or d.repeat_penalty
    s.repeat_last_n = o.repeat_last_n or d.repeat_last_n
    s.seed = o.seed or d.seed
    return s
end


-- ---- messages -------------------------------------------------------------------------

local function show(v)
    if type(v) == "string" then
        return format("%q", v)
    end
    return tostring(v)
end


local function bad(fname, arg, what, level)
    error(format("bad argument '%s' to %s (%s)", arg, fname, what), (level or 2) + 1)
end


-- The RuntimeError "out of memory" (docs/prefix-pool.md) covers both host allocation
-- failures and a KV arena that is full even after eviction.
local function raise_rc(rc, fname, level)
    local msg = lib.last_error()
    if rc == S.ERR_NOMEM or rc == S.ERR_KV_FULL then
        error("out of memory: " .. msg, level + 1)
    elseif rc == S.ERR_INVALID_ARG or rc == S.ERR_TOO_LONG then
        error(fname .. ": " .. msg, level + 1)
    end
    error(format("%s: %s (%s)", fname, msg, lib.status_name[rc] or tostring(rc)), level + 1)
end


-- The convention (lua/README.md): misuse raises, a runtime failure returns
-- nil, message, code. fail_rc(rc, fname, level) -> nil, msg, rc for a
-- runtime failure (the code from the generated enum, never read from the
-- message); it raises for TL_ERR_INVALID_ARG, which is misuse.
local function fail_rc(rc, fname, level)
    if rc == S.ERR_INVALID_ARG then
        raise_rc(rc, fname, level + 1)
    end
    local msg = lib.last_error()
    if rc == S.ERR_NOMEM or rc == S.ERR_KV_FULL then
        return nil, "out of memory: " .. msg, rc
    end
    return nil, fname .. ": " .. msg, rc
end


-- ---- argument checks -------------------------------------------------------------------

local function opt_table(fname, opts, level)
    if opts ~= nil and type(opts) ~= "table" then
        bad(fname, "opts", "expected a table, got " .. type(opts), level + 1)
    end
    return opts or {}
end


local function opt_int(fname, name, v, default, lo, level)
    if v == nil then
        return default
    end
    if type(v) ~= "number" or v ~= floor(v) or v < lo or v > INT_MAX then
        bad(fname, name, format("expected an integer >= %d, got %s", lo, show(v)), level + 1)
    end
    return v
end


local function opt_num(fname, name, v, default, level)
    if v == nil then
        return default
    end
    if type(v) ~= "number" or v ~= v then
        bad(fname, name, "expected a number, got " .. show(v), level + 1)
    end
    return v
end


local function opt_bool(fname, name, v, level)
    if v == nil then
        return false
    end
    if type(v) ~= "boolean" then
        bad(fname, name, "expected a boolean, got " .. show(v), level + 1)
    end
    return v
end


local function check_keys(fname, opts, allowed, level)
    for k in next, opts do
        if not allowed[k] then
            bad(fname, "opts", "unknown option " .. show(k), level + 1)
        end
    end
end


local function keyset(list)
    local t = {}
    for _, k in ipairs(list) do
        t[k] = true
    end
    return t
end


_M.show, _M.bad, _M.raise_rc, _M.fail_rc = show, bad, raise_rc, fail_rc
_M.opt_table, _M.opt_int, _M.opt_num, _M.opt_bool = opt_table, opt_int, opt_num, opt_bool
_M.check_keys, _M.keyset = check_keys, keyset
return _M
