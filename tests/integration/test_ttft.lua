-- The serving path of a cache hit (issue 14): three tenants' long prompts
-- alternate, as tools/server_bench.lua times them, and each return
-- reuses its tenant's whole prefix, for token-id and for text prompts; the
-- completion says where its time went in a Server-Timing header. No timing
-- thresholds: the figures are the bench's.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local check = T.check

package.path = T.ROOT .. "/lua/?.lua;" .. T.ROOT .. "/lua/?/init.lua;" .. package.path
local tl = require "tinyloop"

local N_PREFIX, N_SUFFIX = 300, 8

local ok_run, run_err = pcall(function()
    local vocab = tl.Model(T.MODEL, { vocab_only = true })
    local info = vocab:info()
    local port = T.free_port()
    local srv, err = T.start{ name = "ttft", conf = T.ROOT .. "/examples/nginx.conf", port = port,
        env = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = "ttft" } }
    if not check("an engine instance starts", srv, err) then
        return
    end
    local seed = 7
    local function rand_id()
        seed = (seed * 1103515245 + 12345) % 2147483648
        return 100 + math.floor(seed / 65536) % (info.n_vocab - 100)
    end
    local words = { "Lily", "tree", "happy", "dog", "ran", "big", "sun", "ball" }
    local function complete(prompt)
        local res = T.post(port, "/v1/completions", { prompt = prompt, max_tokens = 1, temperature = 0 }, nil, 60)
        return res or { status = 0, headers = {}, body = "" }
    end

    -- token ids: BOS + prefix, then a fresh suffix per request
    local prefixes = {}
    for t = 1, 3 do
        local p = { info.bos }
        for _ = 1, N_PREFIX do
            p[#p + 1] = rand_id()
        end
        prefixes[t] = p
    end
    local function ids_prompt(t)
        local ids = {}
        for k, v in ipairs(prefixes[t]) do
            ids[k] = v
        end
        for _ = 1, N_SUFFIX do
            ids[#ids + 1] = rand_id()
        end
        return ids
    end
    for round = 0, 2 do
        for t = 1, 3 do
            local res = complete(ids_prompt(t))
            local u = res.json and res.json.usage
            local cached = u and u.prompt_tokens_details.cached_tokens or -1
            if round == 0 then
                check(string.format("ids: tenant %d's first request is a miss", t), res.status == 200
                    and cached < N_PREFIX / 2, res.status .. " cached " .. cached)
            else
                -- the whole prefix and BOS, at least; a suffix id may match by chance
                check(string.format("ids: round %d, tenant %d reuses its whole %d-token prefix", round, t,
                    #prefixes[t]), res.status == 200 and cached >= #prefixes[t]
                    and cached < u.prompt_tokens, res.status .. " cached " .. cached .. " " .. res.body)
            end
        end
    end

    -- text: the server tokenizes; the prefix's ids stay a prefix when the
    -- suffix starts at a word boundary
    local texts = {}
    for t = 1, 3 do
        local w = { "Tenant", tostring(t) }
        for _ = 1, 120 do
            w[#w + 1] = words[1 + rand_id() % #words]
        end
        texts[t] = table.concat(w, " ") .. " "
    end
    for round = 0, 1 do
        for t = 1, 3 do
            local n_pre = #vocab:tokenize(texts[t])
            local res = complete(texts[t] .. "and " .. words[1 + rand_id() % #words] .. " " .. round)
            local u = res.json and res.json.usage
            local cached = u and u.prompt_tokens_details.cached_tokens or -1
            if round == 1 then
                -- the last prefix token may merge with the suffix's first
                check(string.format("text: tenant %d reuses its whole %d-token prefix", t, n_pre),
                    res.status == 200 and cached >= n_pre - 1, res.status .. " cached " .. cached)
            end
        end
    end

    -- Server-Timing: integer ms per phase, the phases within the total
    local res = complete(ids_prompt(1))
    local st = res.headers["server-timing"] or ""
    local d = {}
    for name, v in st:gmatch("([%w_]+);dur=(%d+)") do
        d[name] = tonumber(v)
    end
    check("a completion has a Server-Timing header with parse, prepare, first_token and total",
        res.status == 200 and d.parse and d.prepare and d.first_token and d.total, st)
    check("its phases fit in the total", d.total and d.parse + d.prepare + d.first_token <= d.total + 1, st)
    vocab:close()
end)
if not ok_run then
    check("test_ttft ran without error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
