-- multi_tenant.lua - one model, many tenants: each tenant's system prompt
-- is registered once in a PrefixPool; every request carries the whole
-- conversation and the pool picks the tenant's cached prefix by itself.
-- The "multi-tenant system prompts" pattern of docs/prefix-pool.md.
--
--   luajit examples/multi_tenant.lua [MODEL]   (default ../shared/models/stories260K.gguf)
--
-- Run from the repository root (or set LUA_PATH to include lua/).
local dir = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;" .. package.path
local tl = require "tinyloop"

local path = arg[1] or os.getenv("TINYLOOP_MODEL") or (dir .. "/../shared/models/stories260K.gguf")
local model = tl.Model(path, { max_seq_len = 128 })
local pool = tl.PrefixPool(64)

local tenants = {
    toys = "Once upon a time, there was a little girl who loved her toys.",
    park = "One day, a boy went to the park with his dog.",
    cake = "Mom made a big cake for the birthday party.",
}

-- Register every tenant's tokenised system prompt at start-up.
local sys = {}
for id, text in pairs(tenants) do
    sys[id] = model:tokenize(text)
    local n, err = model:register_prefix(pool, sys[id]) -- nil/0, err on failure
    assert(n and n > 0, err)
    print(("tenant %s: %d prefix tokens cached"):format(id, n))
end

-- A request already starts with its tenant's system prompt; no tenant
-- bookkeeping here.
local function answer(request_tokens)
    return assert(model:generate_with_pool(pool, request_tokens, { max_tokens = 24, temperature = 0 }))
end

for _, id in ipairs { "toys", "park", "cake" } do
    local request = sys[id]
    for _, t in ipairs(model:tokenize("She said", { add_special = false })) do
        request[#request + 1] = t
    end
    local before = model:stats().prefill_tokens_saved
    local out = answer(request)
    local saved = model:stats().prefill_tokens_saved - before
    -- The pool path gives exactly what plain generation gives.
    local plain = assert(model:generate(request, { max_tokens = 24, temperature = 0, no_cache = true }))
    assert(#out == #request + #plain, "pool and plain generation differ in length")
    for i = 1, #plain do
        assert(out[#request + i] == plain[i], "pool and plain generation differ")
    end
    assert(saved >= #sys[id] - 3, "the tenant's prefix was not reused")
    print(("[%s] %d prompt tokens reused: %s"):format(id, saved, model:detokenize(out)))
end

print(("entries: %d  total cached tokens: %d"):format(pool:size(), pool:total_cached_tokens()))
model:close()
