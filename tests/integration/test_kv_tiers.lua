-- KV memory tiers through the server (real nginx, stories260K): with
-- TINYLOOP_KV_DIR and a small arena, (a) a long prompt evicted by others
-- comes back from the disk tier (cached_tokens > 0, the same greedy text,
-- tinyloop_kv_tier_hits_total > 0); (b) after a SIGHUP reload the new
-- worker serves it from disk again (the old worker's exit_worker saved its
-- cache), with the latency of that first request printed beside a cold
-- miss of the same length; (c) block files corrupted while the server is
-- stopped are refused at the next start (a WARN line each in the error
-- log, tinyloop_kv_tier_refused_total) and the request still answers the
-- same text.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local cjson = require "cjson.safe"
local signal = require "posix.signal"
local check = T.check

local conf = T.ROOT .. "/examples/nginx.conf"


-- Worker pids of a master (its children, from /proc), as test_reload.lua.
local function workers(master)
    local out = {}
    local p = io.popen("ls /proc")
    for name in p:lines() do
        local pid = tonumber(name)
        if pid then
            local stat = T.read("/proc/" .. pid .. "/stat")
            local ppid = stat and tonumber(stat:match("^%d+ %b() %S+ (%d+)"))
            if ppid == master then
                out[#out + 1] = pid
            end
        end
    end
    p:close()
    return out
end


-- A story prompt of n words, different from the first word on for each seed.
local WORDS = { "little", "girl", "park", "dog", "happy", "sun", "tree", "ball", "play", "friend", "big",
    "red", "cat", "jump", "run", "mom", "said", "went", "saw", "day", "bird", "sky", "blue", "toy", "box",
    "car", "fish", "water", "home", "cake", "smile", "kind", "good", "help", "look", "funny", "small" }
local function story(seed, n)
    local out, x = { "Once upon a time, " .. WORDS[seed % #WORDS + 1] .. " " .. seed }, seed * 7919 + 17
    for _ = 1, n do
        x = (x * 1103515245 + 12345) % 2147483648
        out[#out + 1] = WORDS[math.floor(x / 65536) % #WORDS + 1]
    end
    return table.concat(out, " ") .. "."
end


local WORDS_PER_PROMPT = 120
local GEN = { max_tokens = 16, temperature = 0 }

local function complete(port, seed)
    local body = { prompt = story(seed, WORDS_PER_PROMPT), max_tokens = GEN.max_tokens,
        temperature = GEN.temperature }
    local t0 = T.now()
    local r = T.post(port, "/v1/completions", body, nil, 30)
    local dt = T.now() - t0
    local j = r and r.json or {}
    local u = j.usage or {}
    return {
        ok = r and r.status == 200, body = r and r.body, latency = dt,
        text = j.choices and j.choices[1] and j.choices[1].text,
        prompt_tokens = u.prompt_tokens or -1,
        cached = u.prompt_tokens_details and u.prompt_tokens_details.cached_tokens or -1,
    }
end


local function metrics(port)
    local r = T.request(port, "GET", "/metrics")
    return r and T.prom(r.body) or {}
end


local function files(dir)
    local out = {}
    local p = io.popen("ls '" .. dir .. "' 2>/dev/null")
    for name in p:lines() do
        if name:match("%.tlkv$") then
            out[#out + 1] = name
        end
    end
    p:close()
    return out
end


-- Flips one byte in the middle of a file.
local function corrupt(path)
    local f = assert(io.open(path, "r+b"))
    local size = f:seek("end")
    local at = math.floor(size / 2)
    f:seek("set", at)
    local b = f:read(1)
    f:seek("set", at)
    f:write(string.char((b:byte() + 1) % 256))
    f:close()
end


local ok_run, run_err = pcall(function()
    local kvdir = T.tmpdir() .. "/kv"
    os.execute("rm -rf '" .. kvdir .. "' && mkdir -p '" .. kvdir .. "' && chmod 777 '" .. kvdir .. "'")
    local env = { TINYLOOP_MODEL = T.MODEL, TINYLOOP_MAX_SEQ_LEN = 512, TINYLOOP_INSTANCE = "kv-tiers",
        TINYLOOP_KV_DIR = kvdir,
        -- 60 blocks of 16 positions (10 KiB each at f16 over 5 layers): room
        -- for about three of these prompts, so eight others evict the first
        TINYLOOP_KV_MEM = 60 * 10240 }
    local port = T.free_port()
    local srv, err = T.start{ name = "kv-tiers", conf = conf, port = port, env = env }
    if not check("an engine instance starts with TINYLOOP_KV_DIR", srv, err) then
        return
    end

    -- ---- (a) evicted, then served from the disk tier ----------------------------------------
    local first = complete(port, 1)
    check("the first long prompt answers", first.ok and first.text, first.body)
    print(string.format("  prompt_tokens %d, cached %d, latency %.1f ms", first.prompt_tokens, first.cached,
        first.latency * 1e3))
    check("it is long (more than 200 tokens) and a miss", first.prompt_tokens > 200 and first.cached < 16,
        first.prompt_tokens .. " / " .. first.cached)
    for seed = 2, 9 do
        local r = complete(port, seed)
        if not r.ok then
            check("an evicting prompt answers", false, r.body)
        end
    end
    local m = metrics(port)
    check("the other prompts evicted the first into the disk tier (spills > 0)",
        (m['tinyloop_kv_tier_spills_total{tier="disk"}'] or 0) > 0 and (m.tinyloop_cache_evictions_total or 0) > 0,
        cjson.encode { spills = m['tinyloop_kv_tier_spills_total{tier="disk"}'],
            evictions = m.tinyloop_cache_evictions_total })
    check("block files are in the directory", #files(kvdir) > 0, #files(kvdir))
    local hits_before = m['tinyloop_kv_tier_hits_total{tier="disk"}'] or 0
    local again = complete(port, 1)
    print(string.format("  again: cached %d of %d, latency %.1f ms", again.cached, again.prompt_tokens,
        again.latency * 1e3))
    check("the evicted prompt comes back with cached_tokens > 0", again.ok and again.cached > 0, again.body)
    check("and the same text (temperature 0)", again.text == first.text,
        cjson.encode { first.text, again.text })
    m = metrics(port)
    check("/metrics: tinyloop_kv_tier_hits_total{tier=\"disk\"} > 0",
        (m['tinyloop_kv_tier_hits_total{tier="disk"}'] or 0) > hits_before,
        m['tinyloop_kv_tier_hits_total{tier="disk"}'])
    check("/metrics: tinyloop_kv_tier_restored_tokens_total > 0",
        (m.tinyloop_kv_tier_restored_tokens_total or 0) > 0, m.tinyloop_kv_tier_restored_tokens_total)
    check("/metrics: every tier family has a host and a disk line", (function()
        for _, fam in ipairs { "blocks", "bytes", "budget_bytes", "spills_total", "hits_total",
            "restore_bytes_total", "refused_total" } do
            for _, t in ipairs { "host", "disk" } do
                if m["tinyloop_kv_tier_" .. fam .. '{tier="' .. t .. '"}'] == nil then
                    return false
                end
            end
        end
        return true
    end)())

    -- ---- (b) a reload: the new worker finds it on disk ---------------------------------------
    local old = workers(srv.pid)
    local n_before = #files(kvdir)
    signal.kill(srv.pid, signal.SIGHUP)
    local replaced = false
    local deadline = T.now() + 30
    while T.now() < deadline do
        local now = workers(srv.pid)
        if #now == 1 and now[1] ~= old[1] and not T.alive(old[1]) then
            replaced = true
            break
        end
        T.sleep(0.05)
    end
    check("SIGHUP: a new worker replaces the old one", replaced, cjson.encode(workers(srv.pid)))
    local up = false
    deadline = T.now() + 20
    while T.now() < deadline do
        local h = T.request(port, "GET", "/health", nil, nil, 2)
        if h and h.status == 200 then
            up = true
            break
        end
        T.sleep(0.05)
    end
    check("the new worker serves", up)
    -- the prompts still in the arena were never evicted: only the exiting
    -- worker's save puts them on disk
    local n_after = #files(kvdir)
    print(string.format("  block files: %d before the reload, %d after the old worker exited", n_before, n_after))
    check("the old worker wrote its cache at exit (exit_worker: more block files)", n_after > n_before,
        n_before .. " -> " .. n_after)
    local warm = complete(port, 1)
    -- the cold miss: of a few new prompts, the one closest in length
    local cold
    for seed = 1000, 1005 do
        local r = complete(port, seed)
        if r.ok and (not cold or math.abs(r.prompt_tokens - warm.prompt_tokens)
            < math.abs(cold.prompt_tokens - warm.prompt_tokens)) then
            cold = r
        end
    end
    cold = cold or { latency = 0, cached = -1, prompt_tokens = -1 }
    print(string.format("  after the reload: first request (warm from disk) %.1f ms, cached %d of %d; "
        .. "a cold miss of the same length %.1f ms, cached %d of %d", warm.latency * 1e3, warm.cached,
        warm.prompt_tokens, cold.latency * 1e3, cold.cached, cold.prompt_tokens))
    check("after the reload the prompt is served from disk (cached_tokens > 0)", warm.ok and warm.cached > 0,
        warm.body)
    check("with the same text", warm.text == first.text, cjson.encode { first.text, warm.text })
    m = metrics(port)
    check("the new worker's disk hits > 0", (m['tinyloop_kv_tier_hits_total{tier="disk"}'] or 0) > 0,
        m['tinyloop_kv_tier_hits_total{tier="disk"}'])

    -- ---- (c) corrupted while stopped: refused, and the answer does not change -----------------
    check("the server stops", T.stop(srv))
    local names = files(kvdir)
    for _, name in ipairs(names) do
        corrupt(kvdir .. "/" .. name)
    end
    print(string.format("  corrupted %d block files", #names))
    port = T.free_port()
    srv, err = T.start{ name = "kv-tiers-2", conf = conf, port = port, env = env }
    if not check("the server starts again on the corrupted directory", srv, err) then
        return
    end
    local log = T.error_log(srv)
    -- a line per refused file, each naming one of them (the engine's report
    -- holds the first ones; a last line counts the rest), and the total
    local named, wrong = 0, 0
    local known = {}
    for _, name in ipairs(names) do
        known[name] = true
    end
    for line in log:gmatch("%[warn%][^\n]*kv_dir refused ([^\n]*)") do
        local file = line:match("([%x]+%.tlkv)")
        if file then
            named = named + 1
            if not known[file] then
                wrong = wrong + 1
            end
        end
    end
    print(string.format("  %d WARN lines name a refused file, e.g. %s", named,
        log:match("kv_dir refused [^\n]*") or "none"))
    check("corrupted files are refused, WARN lines naming them", named > 0 and wrong == 0,
        named .. " named, " .. wrong .. " unknown")
    check("the WARN summary counts every corrupted file as refused",
        log:find("%[warn%][^\n]*block files loaded, " .. #names .. " refused") ~= nil, log:sub(-1500))
    local after = complete(port, 1)
    check("the request still answers with the same text", after.ok and after.text == first.text,
        cjson.encode { first.text, after.text, after.body })
    print(string.format("  cached %d of %d after the corruption", after.cached, after.prompt_tokens))
    m = metrics(port)
    check("/metrics: tinyloop_kv_tier_refused_total{tier=\"disk\"} > 0",
        (m['tinyloop_kv_tier_refused_total{tier="disk"}'] or 0) > 0, m['tinyloop_kv_tier_refused_total{tier="disk"}'])
    T.stop(srv)
end)
if not ok_run then
    check("the KV tier tests ran without a Lua error", false, run_err)
end
T.stop_all()
os.exit(T.summary() and 0 or 1)
