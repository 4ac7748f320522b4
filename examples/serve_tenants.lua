-- serve_tenants.lua - tinyloop's main job (`make run`): one model serving
-- three tenants, each with its own system prompt registered once in a
-- PrefixPool. Every chat request carries the tenant's whole conversation;
-- the pool finds the cached system prompt, so only the new turn is
-- prefilled. Prints each answer, time to first token (uncached baseline vs
-- cached requests), decode speed and the pool's statistics.
--
--   luajit examples/serve_tenants.lua [MODEL]    (default: the fetched Gemma 3 270M)
local dir = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/.."
package.path = dir .. "/lua/?.lua;" .. dir .. "/lua/?/init.lua;" .. package.path
local tl = require "tinyloop"
local now = tl.now

local home = os.getenv("HOME") or ""
local path = arg[1] or os.getenv("MODEL") or
    ((os.getenv("TINYLOOP_MODELS") or (home .. "/.cache/tinyloop/models")) .. "/gemma-3-270m-q4_k_m.gguf")
local f = io.open(path, "rb")
if not f and not arg[1] and not os.getenv("MODEL") then
    -- `make run` fetches the model first; a test run without it skips.
    print("SKIP serve_tenants: the default model is not fetched (make model): " .. path)
    os.exit(0)
end
if f then f:close() end
local model = tl.Model(path, { max_seq_len = 2048 })
local pool = tl.PrefixPool(8)
print(("model %s (chat format: %s)"):format(path, model:chat_template()))

local tenants = {
    { id = "travel", system = "You are the assistant of a travel agency in Europe. You answer questions about "
        .. "cities, countries, capitals, famous sights, museums, food and the best season to visit. Answers are "
        .. "short, friendly and factual: one sentence, naming the place.",
      questions = { "What is the capital of France?", "Which city is famous for its canals, Venice or Berlin?" } },
    { id = "kitchen", system = "You are a helpful cooking assistant. You know recipes from all over the world, "
        .. "how long to boil an egg, how to bake bread and which spices go with which dish. You answer in one "
        .. "short sentence.",
      questions = { "What do I need to make pancakes?", "How long should I boil an egg?" } },
    { id = "space", system = "You are an astronomy teacher for children. You explain the planets, the moon, the "
        .. "sun and the stars in simple words. You answer in one short sentence.",
      questions = { "What is the largest planet in the solar system?", "Why does the moon shine at night?" } },
}

-- Register each tenant's system prompt once: its rendered turn, tokenized
-- (chat_tokenize of the system message alone is a prefix of every
-- conversation that starts with it).
for _, t in ipairs(tenants) do
    t.prefix = model:chat_tokenize({ { role = "system", content = t.system } }, { add_assistant = false })
    local n, err = model:register_prefix(pool, t.prefix) -- nil/0, err on failure
    assert(n and n > 0, err)
    print(("tenant %-8s system prompt: %d tokens cached"):format(t.id, n))
end

-- One chat turn: the tenant's prefix + the new user turn; streamed so the
-- first token's time is measured and the answer stops at the next turn.
local function ask(t, question, opts)
    local prompt = model:chat_tokenize({ { role = "system", content = t.system },
        { role = "user", content = question } })
    local o = { max_tokens = 48, temperature = 0, pool = pool }
    for k, v in pairs(opts or {}) do o[k] = v end
    if o.no_cache then o.pool = nil end
    local t0, first = now(), nil
    local ids = {}
    local next_tok, st = model:stream(prompt, o)
    for tok in next_tok, st do
        first = first or now()
        ids[#ids + 1] = tok
        if model:piece(tok):find("\n", 1, true) then break end
    end
    model:stream_close(st) -- the answer is complete: stop generating now
    local t1 = now()
    local answer = model:detokenize(ids):gsub("\n.*", ""):gsub("^%s+", "")
    return answer, (first or t1) - t0, #ids, t1 - (first or t1), #prompt
end

-- Baseline: the first question of the first tenant without any cache.
local _, cold_ttft = ask(tenants[1], tenants[1].questions[1], { no_cache = true })
local ttfts, gen_tokens, gen_time = {}, 0, 0
for _, t in ipairs(tenants) do
    for _, q in ipairs(t.questions) do
        local answer, ttft, n, dt, plen = ask(t, q)
        ttfts[#ttfts + 1] = ttft
        gen_tokens, gen_time = gen_tokens + n, gen_time + dt
        print(("[%s] (%d prompt tokens, TTFT %.1f ms) Q: %s\n    A: %s"):format(t.id, plen, ttft * 1e3, q, answer))
    end
end

local sum = 0
for _, v in ipairs(ttfts) do sum = sum + v end
print(("TTFT: uncached first request %.1f ms; cached requests %.1f ms on average (%.1fx faster)")
    :format(cold_ttft * 1e3, sum / #ttfts * 1e3, cold_ttft / (sum / #ttfts)))
print(("decode: %d tokens in %.2f s = %.1f tokens/s"):format(gen_tokens, gen_time, gen_tokens / gen_time))
local ps, ms = pool:stats(), model:stats()
print(("pool: %d entries, %d cached tokens, %d lookups, %d hits, %d hit tokens"):format(
    ps.size, ps.total_cached_tokens, ps.lookups, ps.hits, ps.hit_tokens))
print(("cache: %d prefill tokens computed, %d saved; %d of %d KV blocks used"):format(
    ms.prefill_tokens, ms.prefill_tokens_saved, ms.blocks_used, ms.blocks_total))
model:close()
