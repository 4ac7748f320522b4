-- tinyloop.lib - the low-level FFI layer: declares engine/tinyloop.h to the
-- FFI (from the generated tinyloop.cdef), finds and loads libtinyloop.so,
-- and maps status codes to names and messages.
--
--   local lib = require "tinyloop.lib"
--   lib.load("/opt/tinyloop/libtinyloop.so")  -- optional, before require "tinyloop"
--   local C = lib.load()                        -- the loaded library (ffi clib)
--
-- Search order when no library is loaded yet: the explicit path given to
-- load(), $TINYLOOP_LIB, build/libtinyloop.so of the source tree this file
-- sits in (../../build relative to lua/tinyloop/), libtinyloop.so next to
-- this file, the `make install` layout (PREFIX/lib from
-- PREFIX/share/lua/5.1/tinyloop/, so a DESTDIR copy works where it lies),
-- package.cpath (a LuaRocks tree's lib/lua/5.1), then the system library
-- path (ffi.load("tinyloop")). A failure lists every path tried and why
-- each failed.
local ffi = require "ffi"

local ffi_string = ffi.string
local getenv = os.getenv
local concat = table.concat
local error = error

local _M = { C = nil, path = nil, tried = nil }


-- ffi.cdef raises on a second declaration of the same struct, so a second
-- copy of this module (another package.path entry) must not declare again.
if not pcall(ffi.typeof, "tl_model_params") then
    ffi.cdef(require "tinyloop.cdef")
end


-- Status codes (enum tl_status) by name and names by code, read from the
-- generated cdef (so a code added to engine/tinyloop.h needs no edit here).
_M.status = {}
for name in require("tinyloop.cdef"):match("enum tl_status {(.-)}"):gmatch("TL_([%u_]+)%s*=") do
    _M.status[name] = tonumber(ffi.cast("enum tl_status", "TL_" .. name))
end
_M.status_name = {}
for name, code in pairs(_M.status) do
    _M.status_name[code] = "TL_" .. name
end


local function module_dir()
    local src = debug.getinfo(1, "S").source
    if src:sub(1, 1) ~= "@" then
        return nil
    end
    return src:sub(2):match("^(.*)/[^/]*$") or "."
end


-- The candidate paths in search order, as { label, path } pairs; path nil
-- means the system library path.
function _M.candidates(explicit)
    local list = {}
    if explicit then
        list[#list + 1] = { "explicit path", explicit }
    end
    local env = getenv("TINYLOOP_LIB")
    if env and env ~= "" then
        list[#list + 1] = { "TINYLOOP_LIB", env }
    end
    local dir = module_dir()
    if dir then
        list[#list + 1] = { "source tree", dir .. "/../../build/libtinyloop.so" }
        list[#list + 1] = { "next to the Lua files", dir .. "/libtinyloop.so" }
        list[#list + 1] = { "installed prefix", dir .. "/../../../../lib/libtinyloop.so" }
    end
    local rock = package.searchpath("libtinyloop", package.cpath)
    if rock then
        list[#list + 1] = { "package.cpath", rock }
    end
    list[#list + 1] = { "system library path", nil }
    return list
end


-- Loads the library (once) and returns the ffi clib. With a path, that
-- file is tried first; once a library is loaded, later calls return it
-- whatever path they pass (one library per Lua state).
function _M.load(explicit)
    if _M.C then
        return _M.C
    end
    if explicit ~= nil and type(explicit) ~= "string" then
        error("bad argument 'path' to tinyloop.lib.load (expected a string, got "
            .. type(explicit) .. ")", 2)
    end
    local tried = {}
    for _, cand in ipairs(_M.candidates(explicit)) do
        local label, path = cand[1], cand[2]
        local ok, clib = pcall(ffi.load, path or "tinyloop")
        -- A library of another version may lack our symbols: check one.
        if ok and not pcall(function() return clib.tl_last_error end) then
            ok, clib = false, "tl_last_error not found in the library"
        end
        if ok then
            _M.C, _M.path, _M.tried = clib, path or "libtinyloop.so (system)", tried
            return clib
        end
        tried[#tried + 1] = "  " .. label .. ": " .. (path or "libtinyloop.so")
            .. " (" .. tostring(clib) .. ")"
    end
    _M.tried = tried
    error("tinyloop: cannot load libtinyloop.so; tried:\n" .. concat(tried, "\n")
        .. "\nset TINYLOOP_LIB to the library's path or run `make` in the source tree", 2)
end


-- The message of the last failure on this thread.
function _M.last_error()
    return ffi_string(_M.C.tl_last_error())
end


-- The TL_ERR_* code that went with last_error() (compare with
-- lib.status.ERR_* or C.TL_ERR_*).
function _M.last_error_code()
    return _M.C.tl_last_error_code()
end


return _M
