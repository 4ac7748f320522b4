-- server_bench.lua - the three-tenant TTFT test of issue 14 through the
-- servers: 3 tenants, each with a 1,536-token prefix, alternate; each request
-- is prefix + a fresh 32-token suffix (token ids), 1 token out, non-streaming,
-- so the request's wall time (connect to last byte, HTTP + JSON + the 1,568 ids
-- included) is its TTFT. Run against our nginx (examples/nginx.conf) and, when
-- it is built, ik_llama.cpp's llama-server (1 slot, its default RAM prompt
-- cache; measurement only), interleaved request by request so machine noise
-- hits both alike. An epoch starts 3 new prefixes (3 misses) and then cycles
-- them ROUNDS times (hits); misses and hits are reported as p50 and the
-- ratios ours / ik. An "engine" column runs the same prompts in this process
-- through the Lua binding (no HTTP, no nginx): the server's hit minus it is
-- the serving path's overhead. Loopback only; every wait bounded.
--
--   luajit tools/server_bench.lua [MODEL] [--epochs N] [--rounds N] [--threads N]
--       [--ik PATH_TO_LLAMA_SERVER | --no-ik] [--no-engine] [--prefix N] [--suffix N] [--text]
--
-- --threads sets llama-server's and the in-process engine's threads; our
-- nginx engine runs on every core (examples/nginx.conf has no thread
-- setting), which is 2 on the machine the issue measured.
-- --text sends the prompts as text (ours only: llama-server's tokenizer of the
-- synthetic vocab is not ours), checking the cache also hits the whole prefix
-- for text prompts.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "../tests/integration/?.lua;" .. package.path
local T = require "lib"
io.stdout:setvbuf("line")
local cjson = require "cjson.safe"
local unistd = require "posix.unistd"
local signal = require "posix.signal"
local wait = require "posix.sys.wait"

local model = T.ROOT .. "/build/bench/stories110M-q8_0.gguf"
local epochs, rounds, threads, n_prefix, n_suffix = 1, 3, 2, 1536, 32
local in_process = true
local ik = "/tmp/anchor-ik/build/bin/llama-server"
local text_mode = false
local i = 1
while arg[i] do
    local a = arg[i]
    if a == "--epochs" then
        epochs = tonumber(arg[i + 1]); i = i + 1
    elseif a == "--rounds" then
        rounds = tonumber(arg[i + 1]); i = i + 1
    elseif a == "--threads" then
        threads = tonumber(arg[i + 1]); i = i + 1
    elseif a == "--prefix" then
        n_prefix = tonumber(arg[i + 1]); i = i + 1
    elseif a == "--suffix" then
        n_suffix = tonumber(arg[i + 1]); i = i + 1
    elseif a == "--ik" then
        ik = arg[i + 1]; i = i + 1
    elseif a == "--no-ik" then
        ik = nil
    elseif a == "--no-engine" then
        in_process = false
    elseif a == "--text" then
        text_mode = true
    else
        model = a
    end
    i = i + 1
end
for _, v in ipairs({ epochs, rounds, threads, n_prefix, n_suffix }) do
    if not v or v < 1 or v % 1 ~= 0 then
        print("server_bench: --epochs, --rounds, --threads, --prefix and --suffix take integers >= 1")
        os.exit(2)
    end
end
if model:sub(1, 1) ~= "/" then
    model = unistd.getcwd() .. "/" .. model -- llama-server runs in another directory
end
local f = io.open(model)
if not f then
    print("server_bench: no model " .. model .. " (make " .. model:gsub("^" .. T.ROOT .. "/", "") .. "; skipped)")
    os.exit(0)
end
f:close()
if ik then
    f = io.open(ik)
    if f then
        f:close()
    else
        print("server_bench: no " .. ik .. " (ours only; ../shared/tools/anchor-build.sh builds it)")
        ik = nil
    end
end
if text_mode then
    ik = nil
end

package.path = T.ROOT .. "/lua/?.lua;" .. T.ROOT .. "/lua/?/init.lua;" .. package.path
local tl = require "tinyloop"
local vocab = tl.Model(model, { vocab_only = true })
local vinfo = vocab:info()
local n_vocab, bos, block = vinfo.n_vocab, vinfo.bos, vinfo.kv_block_size or 16
local id_lo = math.min(300, math.floor(n_vocab / 2))

local msl = 2048
while msl < n_prefix + n_suffix + 2 do
    msl = msl * 2
end


-- ---- ik_llama.cpp's llama-server ------------------------------------------------------------

local function start_ik(port)
    local log = T.tmpdir() .. "/ik-server.log"
    local pid = unistd.fork()
    if pid == 0 then
        -- exec: the pid is llama-server's own, so the signals below reach it;
        -- in the temp dir, where its llama.log goes
        unistd.execp("sh", { "-c", string.format("cd '%s' && exec '%s' -m '%s' -t %d -tb %d -c %d -np 1 "
            .. "--host 127.0.0.1 --port %d >'%s' 2>&1", T.tmpdir(), ik, model, threads, threads, msl * 2, port,
            log) })
        os.exit(127)
    end
    local deadline = T.now() + 120
    while T.now() < deadline do
        local st = T.request(port, "GET", "/health", nil, nil, 2)
        if st and st.status == 200 then
            return { pid = pid, log = log }
        end
        if wait.wait(pid, wait.WNOHANG) == pid then
            return nil, "llama-server exited: " .. (T.read(log) or ""):sub(-2000)
        end
        T.sleep(0.2)
    end
    signal.kill(pid, signal.SIGKILL)
    wait.wait(pid)
    return nil, "llama-server did not answer /health in 120 s: " .. (T.read(log) or ""):sub(-2000)
end


local function stop_ik(s)
    if not (s and s.pid) then
        return
    end
    signal.kill(s.pid, signal.SIGTERM)
    for _ = 1, 100 do
        if wait.wait(s.pid, wait.WNOHANG) == s.pid then
            s.pid = nil
            return
        end
        T.sleep(0.05)
    end
    signal.kill(s.pid, signal.SIGKILL)
    wait.wait(s.pid)
    s.pid = nil
end


-- ---- prompts -----------------------------------------------------------------------------------

-- Token ids drawn from above the control tokens, fixed seed.
local seed = 12345
local function rand_id()
    seed = (seed * 1103515245 + 12345) % 2147483648
    return id_lo + math.floor(seed / 65536) % (n_vocab - id_lo) -- the LCG's low bits have short periods
end

local function new_ids(n)
    local t = {}
    for k = 1, n do
        t[k] = rand_id()
    end
    return t
end

-- Text prompts: words that do not merge across the boundary.
local words = { "Lily", "tree", "happy", "dog", "ran", "big", "sun", "ball", "mom", "said", "park", "fun" }
local function new_text(n)
    local t = {}
    for k = 1, n do
        t[k] = words[1 + rand_id() % #words]
    end
    return table.concat(t, " ") .. " "
end


-- ---- one request -----------------------------------------------------------------------------

local function timed(port, path, body)
    local t0 = T.now()
    local res, err = T.request(port, "POST", path, body, nil, 120)
    local dt = T.now() - t0
    if not res or res.status ~= 200 then
        return nil, tostring(err or (res.status .. " " .. res.body:sub(1, 300)))
    end
    return dt, res.json, res.headers["server-timing"]
end


local function ours_body(prompt)
    return cjson.encode({ prompt = prompt, max_tokens = 1, temperature = 0 })
end


local function ik_body(ids)
    return cjson.encode({ prompt = ids, n_predict = 1, cache_prompt = true, temperature = 0 })
end


-- ---- run --------------------------------------------------------------------------------------

local function percentile(xs, p)
    if #xs == 0 then
        return 0 / 0
    end
    local s = {}
    for k = 1, #xs do
        s[k] = xs[k]
    end
    table.sort(s)
    return s[math.max(1, math.ceil(#s * p))]
end

local port = T.free_port()
local srv, err = T.start{ name = "server-bench", conf = T.ROOT .. "/examples/nginx.conf", port = port,
    env = { TINYLOOP_MODEL = model, TINYLOOP_MAX_SEQ_LEN = msl, TINYLOOP_INSTANCE = "bench" } }
if not srv then
    print("server_bench: " .. tostring(err))
    T.stop_all()
    os.exit(1)
end
local iks, ik_port
if ik then
    ik_port = T.free_port()
    iks, err = start_ik(ik_port)
    if not iks then
        print("server_bench: " .. tostring(err) .. " (ours only)")
    end
end

print(string.format("server bench: %s, %d tenants x %d-token prefix + %d-token suffix, 1 token out, %d thread(s), "
    .. "%s prompts, %d epoch(s) x (3 misses + %d x 3 hits); ours on port %d%s", model:match("[^/]*$"), 3, n_prefix,
    n_suffix, threads, text_mode and "text" or "token-id", epochs, rounds, port,
    iks and (", llama-server on port " .. ik_port) or ""))
local res = { ours = { miss = {}, hit = {} }, ik = { miss = {}, hit = {} }, engine = { miss = {}, hit = {} } }
local tm
if in_process then
    tm = tl.Model(model, { max_seq_len = msl, n_threads = threads })
end
local cached_short, failures = 0, 0
local phases, phase_names = { miss = {}, hit = {} }, {}
for e = 1, epochs do
    local prefixes, n_pre = {}, {}
    for t = 1, 3 do
        prefixes[t] = text_mode and new_text(n_prefix) or new_ids(n_prefix)
        n_pre[t] = text_mode and #vocab:tokenize(prefixes[t]) or n_prefix + 1
    end
    for r = 0, rounds do
        local kind = r == 0 and "miss" or "hit"
        for t = 1, 3 do
            local ours_prompt, ids
            if text_mode then
                ours_prompt = prefixes[t] .. new_text(n_suffix)
            else
                ids = { bos }
                for k = 1, n_prefix do
                    ids[#ids + 1] = prefixes[t][k]
                end
                for _, v in ipairs(new_ids(n_suffix)) do
                    ids[#ids + 1] = v
                end
                ours_prompt = ids
            end
            local dt, j, timing = timed(port, "/v1/completions", ours_body(ours_prompt))
            if dt then
                -- the server's own split (Server-Timing, ms), and what is left: the client's
                -- connect, sending 1,568 ids, nginx reading the request, writing the response
                local server_ms = 0
                for name, v in (timing or ""):gmatch("([%w_]+);dur=([%d.]+)") do
                    if not phases[kind][name] then
                        phases[kind][name] = {}
                        if kind == "miss" then
                            phase_names[#phase_names + 1] = name
                        end
                    end
                    local tab = phases[kind][name]
                    tab[#tab + 1] = tonumber(v) / 1000
                    if name == "total" then
                        server_ms = tonumber(v) / 1000
                    end
                end
                phases[kind].client = phases[kind].client or {}
                phases[kind].client[#phases[kind].client + 1] = dt - server_ms
                res.ours[kind][#res.ours[kind] + 1] = dt
                local u = j and j.usage
                local cached = u and u.prompt_tokens_details and u.prompt_tokens_details.cached_tokens or -1
                -- a hit must reuse the whole prefix (BOS included), less what
                -- the cache does not share: the last, partial KV block, and
                -- in text a token where tokenization merges at the seam
                if kind == "hit" and u and cached < n_pre[t] - block - (text_mode and 1 or 0) then
                    cached_short = cached_short + 1
                    print(string.format("  ours: hit reused only %d of the %d prefix tokens (%d in the prompt)",
                        cached, n_pre[t], u.prompt_tokens))
                end
                if u and e == 1 and t == 1 and r <= 1 then
                    print(string.format("  (tenant 1 %s: %d prompt tokens, prefix %d, cached %d)", kind,
                        u.prompt_tokens, n_pre[t], cached))
                end
            else
                failures = failures + 1
                print("  ours: " .. j)
            end
            if tm and not text_mode then
                local t0 = T.now()
                tm:generate(ids, { max_tokens = 1, temperature = 0 })
                res.engine[kind][#res.engine[kind] + 1] = T.now() - t0
            end
            if iks then
                local dt2, j2 = timed(ik_port, "/completion", ik_body(ids))
                if dt2 then
                    res.ik[kind][#res.ik[kind] + 1] = dt2
                else
                    failures = failures + 1
                    print("  llama-server: " .. j2)
                end
            end
            print(string.format("  epoch %d round %d tenant %d %-4s ours %7.1f ms%s%s", e, r, t, kind,
                (dt or 0 / 0) * 1000, tm and not text_mode and string.format("   engine %7.1f ms",
                res.engine[kind][#res.engine[kind]] * 1000) or "", iks and string.format("   llama-server %7.1f ms",
                (res.ik[kind][#res.ik[kind]] or 0 / 0) * 1000) or ""))
        end
    end
end
stop_ik(iks)
T.stop_all()
vocab:close()

local function ms(x)
    return string.format("%7.1f ms", x * 1000)
end
print(string.format("%-14s %10s %10s %10s %10s", "TTFT p50", "miss", "hit", "miss n", "hit n"))
local om, oh = percentile(res.ours.miss, 0.5), percentile(res.ours.hit, 0.5)
print(string.format("%-14s %10s %10s %10d %10d", "tinyloop", ms(om), ms(oh), #res.ours.miss, #res.ours.hit))
if #phase_names > 0 then
    phase_names[#phase_names + 1] = "client"
    for _, name in ipairs(phase_names) do
        print(string.format("  %-12s %10s %10s%s", name, ms(percentile(phases.miss[name] or {}, 0.5)),
            ms(percentile(phases.hit[name] or {}, 0.5)), name == "client" and "   (HTTP outside the handler)"
            or name == "first_token" and "   (submit to first token: queue, prefill, notification)" or ""))
    end
end
if tm and not text_mode then
    local em, eh = percentile(res.engine.miss, 0.5), percentile(res.engine.hit, 0.5)
    print(string.format("%-14s %10s %10s %10d %10d   (in process, no HTTP)", "engine", ms(em), ms(eh),
        #res.engine.miss, #res.engine.hit))
    print(string.format("%-14s %10s %10s   (serving path: HTTP, JSON, validation, notification)",
        "ours - engine", ms(om - em), ms(oh - eh)))
end
if iks then
    local im, ih = percentile(res.ik.miss, 0.5), percentile(res.ik.hit, 0.5)
    print(string.format("%-14s %10s %10s %10d %10d", "llama-server", ms(im), ms(ih), #res.ik.miss, #res.ik.hit))
    print(string.format("%-14s %9.2fx %9.2fx   (goal: miss <= 1.10x, hit <= 1.00x)", "ours / ik", om / im,
        oh / ih))
end
if cached_short > 0 then
    print(string.format("server_bench: %d hit(s) did not reuse the whole prefix", cached_short))
end
if failures > 0 then
    print(string.format("server_bench: %d request(s) failed", failures))
end
os.exit((failures == 0 and cached_short == 0) and 0 or 1)
