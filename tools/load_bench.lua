-- load_bench.lua - HTTP load benchmark of one engine instance (examples/nginx.conf
-- on a loopback port): requests/s, TTFT p50/p99 and tokens/s at 1, 8 and 32
-- concurrent streaming clients, with and without prefix reuse. Bounded: ROUNDS
-- waves per setting and a time limit per setting; loopback only.
--
--   luajit tools/load_bench.lua [MODEL] [--rounds N] [--max-tokens N] [--clients 1,8,32]
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "../tests/integration/?.lua;" .. package.path
local T = require "lib"

local model, rounds, max_tokens, clients = T.MODEL, 4, 64, { 1, 8, 32 }
local i = 1
while arg[i] do
    local a = arg[i]
    if a == "--rounds" then
        rounds = tonumber(arg[i + 1]); i = i + 1
    elseif a == "--max-tokens" then
        max_tokens = tonumber(arg[i + 1]); i = i + 1
    elseif a == "--clients" then
        clients = {}
        for c in arg[i + 1]:gmatch("%d+") do
            clients[#clients + 1] = tonumber(c)
        end
        i = i + 1
    else
        model = a
    end
    i = i + 1
end
local f = io.open(model)
if not f then
    print("load_bench: no model " .. model .. " (skipped)")
    os.exit(0)
end
f:close()

-- A shared preamble of about 200 tokens (the "system prompt" every request reuses).
local preamble = string.rep("Once upon a time, there was a little girl named Lily. She loved to play "
    .. "outside in the sun with her dog. ", 6)

local function percentile(xs, p)
    if #xs == 0 then
        return 0
    end
    table.sort(xs)
    return xs[math.max(1, math.ceil(#xs * p))]
end

local port = T.free_port()
local srv, err = T.start{ name = "bench", conf = T.ROOT .. "/examples/nginx.conf", port = port,
    env = { TINYLOOP_MODEL = model, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = "bench" } }
if not srv then
    print("load_bench: " .. tostring(err))
    T.stop_all()
    os.exit(1)
end

print(string.format("load bench: %s, streaming, max_tokens %d, %d waves per setting, loopback port %d",
    model:match("[^/]*$"), max_tokens, rounds, port))
print(string.format("%-8s %-7s %6s %9s %10s %10s %10s %8s", "clients", "reuse", "reqs", "req/s",
    "TTFT p50", "TTFT p99", "tokens/s", "cached%"))
local serial = 0
for _, reuse in ipairs({ false, true }) do
    for _, c in ipairs(clients) do
        local ttft, ntok, nreq, nfail, nprompt, ncached = {}, 0, 0, 0, 0, 0
        local t0 = T.now()
        for _ = 1, rounds do
            if T.now() - t0 > 60 then
                break
            end
            local reqs = {}
            for k = 1, c do
                serial = serial + 1
                local prompt
                if reuse then
                    prompt = preamble .. "Story " .. serial .. ":"
                else
                    -- a distinct start: nothing beyond BOS is shared
                    prompt = serial .. " " .. preamble:sub(1 + serial % 50) .. "Story:"
                end
                reqs[k] = { port = port, path = "/v1/completions", body = { prompt = prompt,
                    max_tokens = max_tokens, temperature = 0.8, seed = serial, stream = true } }
            end
            local st = T.many(reqs, { timeout = 60 })
            for _, s in ipairs(st) do
                local ev, done = T.sse(s.res and s.res.body or "")
                local last = ev[#ev]
                if s.res and s.res.status == 200 and done and last and last.usage then
                    nreq = nreq + 1
                    ttft[#ttft + 1] = s.t_first or 0
                    ntok = ntok + last.usage.completion_tokens
                    nprompt = nprompt + last.usage.prompt_tokens
                    ncached = ncached + last.usage.prompt_tokens_details.cached_tokens
                else
                    nfail = nfail + 1
                end
            end
        end
        local wall = T.now() - t0
        print(string.format("%-8d %-7s %6d %9.1f %8.1fms %8.1fms %10.0f %7.0f%%%s", c, reuse and "yes" or "no",
            nreq, nreq / wall, percentile(ttft, 0.5) * 1000, percentile(ttft, 0.99) * 1000, ntok / wall,
            nprompt > 0 and 100 * ncached / nprompt or 0, nfail > 0 and ("  (" .. nfail .. " failed)") or ""))
    end
end
T.stop_all()
