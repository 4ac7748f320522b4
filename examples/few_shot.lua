-- few_shot.lua - a library of few-shot templates of different lengths in
-- one PrefixPool; callers hand in the whole prompt and the pool picks the
-- deepest template it starts with. The "few-shot template
-- library" pattern of docs/prefix-pool.md.
--
--   luajit examples/few_shot.lua [MODEL]   (default ../shared/models/stories260K.gguf)
local dir = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;" .. package.path
local tl = require "tinyloop"

local path = arg[1] or os.getenv("TINYLOOP_MODEL") or (dir .. "/../shared/models/stories260K.gguf")
local model = tl.Model(path, { max_seq_len = 128 })
local pool = tl.PrefixPool(8)

-- Each template extends the previous one, as shot libraries often do.
local shots = {
    "Lily had a red ball.",
    " Tom had a big dog.",
    " Sue had a small cat.",
    " Ben had a blue car.",
}
local templates, text = {}, ""
for i, name in ipairs { "zero_shot", "one_shot", "three_shot", "chain_of_thought" } do
    text = text .. shots[i]
    templates[#templates + 1] = { name = name, tokens = model:tokenize(text) }
end

for _, t in ipairs(templates) do
    -- runtime failures come back as nil, err, code (lua/README.md)
    local n, err = model:register_prefix(pool, t.tokens)
    assert(n and n > 0, err)
end
print(("entries: %d  total cached tokens: %d"):format(pool:size(), pool:total_cached_tokens()))

-- Callers just hand in the whole prompt; the deepest template wins.
for _, t in ipairs(templates) do
    local prompt = {}
    for i = 1, #t.tokens do
        prompt[i] = t.tokens[i]
    end
    for _, id in ipairs(model:tokenize("Then", { add_special = false })) do
        prompt[#prompt + 1] = id
    end
    local before = pool:stats().hit_tokens
    local out = assert(model:generate_with_pool(pool, prompt, { max_tokens = 16, temperature = 0 }))
    local matched = pool:stats().hit_tokens - before
    assert(matched >= #t.tokens, ("%s: matched %d of %d template tokens"):format(t.name, matched, #t.tokens))
    print(("%-16s matched %2d tokens: %s"):format(t.name, matched, model:detokenize(out)))
end
model:close()
