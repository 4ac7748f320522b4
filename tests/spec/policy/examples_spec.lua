-- examples/policies: the example policies load, and the REPL session that
-- edits a policy shows the reload.
local helpers = require "helpers"
local policy = require "tinyloop.policy"

describe("examples/policies", function()
    for _, f in ipairs { "tenants", "eviction", "routing" } do
        it("loads " .. f .. ".lua as a " .. f .. " policy", function()
            local src = helpers.read(helpers.root .. "/examples/policies/" .. f .. ".lua")
            local kind = f == "tenants" and "tenants" or f
            local v, err = policy.compile(src, f .. ".lua", { kind = kind })
            assert.is_truthy(v, err)
        end)
    end

    it("runs the REPL session: a bad edit is rejected, a good one reloads, a request keeps its version", function()
        local out, ok = helpers.run("cd '" .. helpers.root .. "' && luajit examples/policies/repl_session.lua")
        assert.is_true(ok, out)
        assert.matches("self_test failed: .*a full candidate is skipped %(still serving example%-capacity%-1 #1%)", out)
        assert.matches("now serving example%-capacity%-2 #2", out)
        assert.matches('"example%-capacity%-1"\t"example%-capacity%-2"\t"gpu1"', out)
        assert.matches("unexpected symbol near '<eof>' %(still serving example%-capacity%-2 #2%)", out)
        assert.matches("reloads_ok = 2,\n%s*reloads_rejected = 2", out)
    end)
end)
