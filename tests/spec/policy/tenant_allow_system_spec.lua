-- The tenants contract's allow_system field (a client's system message is
-- refused for a tenant with allow_system = false; the server enforces it).
local contracts = require "tinyloop.policy.contracts"

describe("tenants contract", function()
    describe("check_tenant()", function()
        it("accepts allow_system = true or false, or no such field", function()
            assert.is_nil(contracts.check_tenant({ id = "a", allow_system = false }))
            assert.is_nil(contracts.check_tenant({ id = "a", allow_system = true }))
            assert.is_nil(contracts.check_tenant({ id = "a" }))
        end)

        it("refuses an allow_system that is not a boolean, naming the tenant", function()
            assert.equal("tenant a: allow_system must be a boolean",
                contracts.check_tenant({ id = "a", allow_system = "no" }))
        end)
    end)
end)
