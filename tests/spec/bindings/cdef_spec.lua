-- The FFI declarations are generated from engine/tinyloop.h; these specs
-- check that they load and that they agree with libtinyloop.so's exports.
local helpers = require "helpers"

local root = helpers.root
local gen = root .. "/bindings/gen_cdef.lua"


local function declared_functions(cdef)
    local names, seen = {}, {}
    for name in cdef:gmatch("[%w_%*%s]-[%s%*](tl_[%w_]+)%s*%(") do
        if not seen[name] then
            seen[name] = true
            names[#names + 1] = name
        end
    end
    table.sort(names)
    return names
end


local function exported_functions()
    local f = assert(io.popen("nm -D --defined-only '" .. root .. "/build/libtinyloop.so' 2>/dev/null"))
    local names = {}
    for line in f:lines() do
        local kind, name = line:match("^%x*%s+(%a)%s+(tl_[%w_]+)$")
        if name and kind == "T" then
            names[#names + 1] = name
        end
    end
    f:close()
    table.sort(names)
    return names
end


describe("bindings/gen_cdef.lua", function()
    local tmp = helpers.tmpdir()

    local function generate(header_text)
        local h = tmp .. "/h.h"
        local f = assert(io.open(h, "wb"))
        f:write(header_text)
        f:close()
        local out, ok = helpers.run("luajit '" .. gen .. "' '" .. h .. "' '" .. tmp .. "/cdef.lua'")
        assert(ok, out)
        return dofile(tmp .. "/cdef.lua")
    end

    it("drops comments, preprocessor lines and the extern \"C\" block", function()
        local text = generate([[
/* a header */
#ifndef X_H
#define X_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
// a line comment
typedef struct tl_x tl_x; /* trailing */
enum tl_e { TL_A = 0, /* one */
            TL_B = -1 };
int tl_x_new(int n, /* out */ tl_x **out);
#ifdef __cplusplus
}
#endif
#endif
]])
        assert.is_nil(text:find("/*", 1, true))
        assert.is_nil(text:find("//", 1, true))
        assert.is_nil(text:find("#", 1, true))
        assert.is_nil(text:find("extern", 1, true))
        assert.is_nil(text:find("}\n$", 1, false) and text:match("\n}%s*$"))
        assert.truthy(text:find("int tl_x_new(int n,  tl_x **out);", 1, true))
        assert.truthy(text:find("TL_B = -1 };", 1, true))
    end)

    it("writes lua/tinyloop/cdef.lua that ffi.cdef accepts", function()
        local cdef = require "tinyloop.cdef"
        assert.is_string(cdef)
        -- A fresh state, so nothing was declared before.
        local out, ok = helpers.run("luajit -e \"require('ffi').cdef(dofile('" .. root
            .. "/lua/tinyloop/cdef.lua'))\"")
        assert.is_true(ok, out)
    end)

    it("is up to date with engine/tinyloop.h", function()
        local fresh = generate(helpers.read(root .. "/engine/tinyloop.h"))
        assert.are.equal(fresh, require "tinyloop.cdef")
    end)
end)


describe("libtinyloop.so", function()
    local cdef = require "tinyloop.cdef"
    local C = require("tinyloop.lib").load()
    local declared = declared_functions(cdef)
    local is_declared = {}
    for _, n in ipairs(declared) do
        is_declared[n] = true
    end

    it("declares more than a handful of functions (the parser works)", function()
        assert.is_true(#declared > 30)
        assert.is_true(is_declared.tl_model_open and is_declared.tl_pool_register and true)
    end)

    for _, name in ipairs(declared) do
        it("exports " .. name .. ", which tinyloop.h declares", function()
            assert.is_true(pcall(function() return C[name] end), name .. " missing from libtinyloop.so")
        end)
    end

    -- Every tl_ function the library exports must be public API: internal
    -- helpers should be hidden (visibility) rather than listed here.
    local exported = exported_functions()
    it("exports tl_ functions at all (nm works)", function()
        assert.is_true(#exported > 0)
    end)
    for _, name in ipairs(exported) do
        if not is_declared[name] then
            it("does not export " .. name .. ", which tinyloop.h does not declare", function()
                error(name .. " is exported by libtinyloop.so but not declared in engine/tinyloop.h")
            end)
        end
    end
end)


describe("bindings/tinyloop.pc", function()
    local pc = helpers.read(root .. "/bindings/tinyloop.pc")

    it("names the library, its flags and private dependencies", function()
        assert.truthy(pc:find("Name: tinyloop", 1, true))
        assert.truthy(pc:find("Libs: -L${libdir} -ltinyloop", 1, true))
        assert.truthy(pc:find("Cflags: -I${includedir}", 1, true))
        assert.truthy(pc:find("Libs.private:", 1, true))
    end)

    it("is read by pkg-config when pkg-config is installed", function()
        local _, has = helpers.run("command -v pkg-config")
        if not has then
            pending("SKIP: pkg-config not installed")
            return
        end
        local out, ok = helpers.run("PKG_CONFIG_PATH='" .. root .. "/bindings' pkg-config --libs tinyloop")
        assert.is_true(ok, out)
        assert.truthy(out:find("-ltinyloop", 1, true))
    end)
end)
