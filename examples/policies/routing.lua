-- Example routing policy: like lua/policies/routing.lua but stricter about
-- capacity -- never route to a candidate at or over its capacity while
-- another has room, then prefer the best cached match, then the least load.
local P = { kind = "routing", version = "example-capacity-1" }

local function full(c)
    return c.capacity and (c.load or 0) + (c.queued or 0) >= c.capacity
end

function P.choose(req, cands) -- luacheck: ignore req (the REPL session uses it)
    local best, best_key
    for _, c in ipairs(cands) do
        local key = (full(c) and -1e12 or 0) + (c.match or 0) * 1000 - ((c.load or 0) + (c.queued or 0))
        if not best or key > best_key then
            best, best_key = c, key
        end
    end
    return best
end

function P.self_test()
    local a = { id = "a", load = 8, capacity = 8, match = 500 }
    local b = { id = "b", load = 1, capacity = 8, match = 0 }
    assert(P.choose({}, { a, b }) == b, "a full candidate is skipped")
end

return P
