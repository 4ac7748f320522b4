-- Example tenants policy: three customers and a free tier.
--   load:   policy.Runtime{ path = "examples/policies/tenants.lua", kind = "tenants" }
--   serve:  require("tinyloop.policy.tenants").new(model, { path = ... }):generate(request, opts)
-- Each tenant's system prompt is cached once behind the shared operator
-- prompt in the tenant's own salt namespace; "legal" pins a versioned FAQ
-- prefix (request.prefix = "faq") and reports it as faq@2024-06.
local P = { kind = "tenants", version = "example-3" }

P.shared = {
    { name = "operator", version = "2", text = "You are a careful assistant. Answer briefly and truthfully." },
}

P.tenants = {
    shop = { id = "shop", api_key = "sk-shop", priority = 1, kv_budget = 96,
             system = "You help customers of an online shop find products.",
             limits = { max_prompt = 1500, max_tokens = 256 } },
    legal = { id = "legal", api_key = "sk-legal", priority = 2, kv_budget = 192,
              system = { "You summarise contracts for lawyers." },
              prefixes = { { name = "faq", version = "2024-06",
                             text = "FAQ: a contract needs offer and acceptance." } },
              limits = { max_prompt = 1900, max_tokens = 512 } },
    games = { id = "games", api_key = "sk-games", priority = 0, kv_budget = 32,
              system = "You narrate short fantasy adventures.", limits = { max_tokens = 128 } },
}

P.default = { id = "free", priority = 0, kv_budget = 16, limits = { max_prompt = 256, max_tokens = 32 } }

local by_key = {}
for _, t in pairs(P.tenants) do
    by_key[t.api_key] = t
end

function P.resolve(req)
    local key = req.api_key
    if not key and req.headers and req.headers.authorization then
        key = req.headers.authorization:match("^Bearer%s+(%S+)$")
    end
    return by_key[key or ""] or P.default
end

function P.self_test()
    assert(P.resolve({ headers = { authorization = "Bearer sk-legal" } }).id == "legal")
    assert(P.resolve({ api_key = "sk-nope" }).id == "free")
end

return P
