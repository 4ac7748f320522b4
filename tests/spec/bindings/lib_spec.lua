-- tinyloop.lib: finding and loading libtinyloop.so, status codes, errors.
local helpers = require "helpers"

local root = helpers.root
local so = root .. "/build/libtinyloop.so"


-- Runs a Lua snippet in a fresh luajit whose package.path holds only a
-- copy of lua/tinyloop in dir (so "next to the Lua files" is under dir).
local function run_isolated(dir, code, env)
    local out, ok = helpers.run((env or "") .. " LUA_PATH='" .. dir .. "/?.lua;" .. dir
        .. "/?/init.lua;;' LD_LIBRARY_PATH= luajit -e \"" .. code .. "\"")
    return out, ok
end


describe("tinyloop.lib", function()
    local lib = require "tinyloop.lib"

    describe(".load()", function()
        local tmp = helpers.tmpdir()
        -- tmp/a/b/tinyloop/*.lua: ../../build is tmp/a/build, absent.
        local pkg = tmp .. "/a/b"
        assert(os.execute("mkdir -p '" .. pkg .. "/tinyloop' && cp '" .. root .. "'/lua/tinyloop/*.lua '"
            .. pkg .. "/tinyloop/'"))

        it("loads the library of the source tree by default", function()
            lib.load()
            assert.is_truthy(lib.C)
            assert.is_truthy(lib.path:find("build/libtinyloop.so", 1, true))
        end)

        it("lists every path it tried, and why, when nothing loads", function()
            local out, ok = run_isolated(pkg, "require('tinyloop.lib').load('/nonexistent/explicit.so')",
                "TINYLOOP_LIB=/nonexistent/env.so")
            assert.is_false(ok)
            assert.truthy(out:find("cannot load libtinyloop.so; tried:", 1, true), out)
            assert.truthy(out:find("explicit path: /nonexistent/explicit.so (", 1, true), out)
            assert.truthy(out:find("TINYLOOP_LIB: /nonexistent/env.so (", 1, true), out)
            assert.truthy(out:find("source tree: " .. pkg .. "/tinyloop/../../build/libtinyloop.so (", 1, true),
                out)
            assert.truthy(out:find("next to the Lua files: " .. pkg .. "/tinyloop/libtinyloop.so (", 1, true),
                out)
            assert.truthy(out:find("system library path: libtinyloop.so (", 1, true), out)
        end)

        it("takes an explicit path first", function()
            local out, ok = run_isolated(pkg, "local l = require('tinyloop.lib'); l.load('" .. so
                .. "'); print(l.path)", "TINYLOOP_LIB=/nonexistent/env.so")
            assert.is_true(ok, out)
            assert.are.equal(so .. "\n", out)
        end)

        it("takes $TINYLOOP_LIB when no path is given", function()
            local out, ok = run_isolated(pkg, "local l = require('tinyloop.lib'); l.load(); print(l.path)",
                "TINYLOOP_LIB='" .. so .. "'")
            assert.is_true(ok, out)
            assert.are.equal(so .. "\n", out)
        end)

        it("finds libtinyloop.so next to the Lua files", function()
            assert(os.execute("cp '" .. so .. "' '" .. pkg .. "/tinyloop/'"))
            local out, ok = run_isolated(pkg, "local l = require('tinyloop.lib'); l.load(); print(l.path)")
            os.remove(pkg .. "/tinyloop/libtinyloop.so")
            assert.is_true(ok, out)
            assert.are.equal(pkg .. "/tinyloop/libtinyloop.so\n", out)
        end)

        it("finds the library on the system library path", function()
            local libdir = tmp .. "/syslib"
            assert(os.execute("mkdir -p '" .. libdir .. "' && cp '" .. so .. "' '" .. libdir .. "/'"))
            local out, ok = helpers.run("LUA_PATH='" .. pkg .. "/?.lua;" .. pkg .. "/?/init.lua;;' LD_LIBRARY_PATH='"
                .. libdir .. "' luajit -e \"local l = require('tinyloop.lib'); l.load(); print(l.path)\"")
            assert.is_true(ok, out)
            assert.are.equal("libtinyloop.so (system)\n", out)
        end)

        it("rejects a path that is not a string", function()
            package.loaded["tinyloop.lib"] = nil
            local fresh = require "tinyloop.lib"
            assert.has_error(function() fresh.load(42) end,
                "bad argument 'path' to tinyloop.lib.load (expected a string, got number)")
        end)
    end)

    describe(".status", function()
        it("maps every tl_status name to its code and back", function()
            assert.are.equal(0, lib.status.OK)
            assert.are.equal(-1, lib.status.ERR_INVALID_ARG)
            assert.are.equal(-6, lib.status.ERR_KV_FULL)
            assert.are.equal(-9, lib.status.ERR_STATE)
            local ffi = require "ffi"
            for name, code in pairs(lib.status) do
                assert.are.equal(code, tonumber(ffi.new("enum tl_status", "TL_" .. name)))
                assert.are.equal("TL_" .. name, lib.status_name[code])
            end
        end)
    end)

    describe(".last_error()", function()
        it("returns the message of the last failing C call", function()
            local C = lib.load()
            local ffi = require "ffi"
            local out = ffi.new("tl_pool *[1]")
            assert.are.equal(lib.status.ERR_INVALID_ARG, C.tl_pool_new(-3, out))
            assert.are.equal("capacity -3 must be >= 0", lib.last_error())
        end)
    end)
end)
