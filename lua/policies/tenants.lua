-- Tenant mapping (example and default): an API key names a tenant (the
-- x-tenant header may only pick a tenant without an api_key: a keyed
-- tenant is reached with its key alone, and the runtime checks that); each tenant has its system prompt(s), a pool, a
-- cache salt (true: derived from the id, so tenants never share cached
-- blocks), a priority, a KV budget in blocks and limits. `shared` lists the
-- operator's prompts: cached once in a shareable pool, reused by every
-- tenant; what follows them stays in each tenant's own salt namespace.
local P = { kind = "tenants", version = "2026-11-29.1" }

P.shared = {
    { name = "operator", version = "1", text = "You are a helpful assistant. Be brief." },
}

P.tenants = {
    acme = {
        id = "acme", api_key = "sk-acme", salt = true, priority = 2, kv_budget = 64,
        system = { "Acme support: answer about rockets." },
        prefixes = { { name = "faq", version = "3", text = "Q: fuel? A: liquid." } },
        limits = { max_prompt = 1024, max_tokens = 128 },
    },
    globex = {
        id = "globex", api_key = "sk-globex", salt = true, priority = 1, kv_budget = 32,
        system = { "Globex: answer in one line." },
        limits = { max_prompt = 512, max_tokens = 64 },
    },
}

local by_key = {}
for _, t in pairs(P.tenants) do
    by_key[t.api_key] = t
end

P.default = { id = "public", salt = true, priority = 0, kv_budget = 16, limits = { max_tokens = 32 } }

function P.resolve(req)
    if req.api_key then
        return by_key[req.api_key]      -- an unknown key is refused (401), not served as public
    end
    local named = req.headers and P.tenants[req.headers["x-tenant"] or ""]
    if named and not named.api_key then
        return named
    end
    return P.default
end

function P.self_test()
    assert(P.resolve({ api_key = "sk-acme" }).id == "acme")
    assert(P.resolve({ headers = { ["x-tenant"] = "globex" } }).id == "public")
    assert(P.resolve({ api_key = "sk-nope" }) == nil)
    assert(P.resolve({}).id == "public")
end

return P
