-- The Lua sources are luacheck clean (.luacheckrc: LuaJIT std, busted in specs).
local helpers = require "helpers"

describe("luacheck", function()
    it("reports no warnings for lua/, bindings/, tests/spec/ and examples/", function()
        local _, has = helpers.run("command -v luacheck")
        if not has then
            pending("SKIP: luacheck (Debian package lua-check) not installed")
            return
        end
        local out, ok = helpers.run("cd '" .. helpers.root .. "' && luacheck --no-color -q lua bindings tests/spec examples")
        assert.is_true(ok, out)
    end)
end)
