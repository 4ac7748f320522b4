-- Serving from a checkout nobody else can read (issue 15): a copy of the tree
-- and the model in a mode 0700 directory, started (1) by root with the copy
-- owned by root (the workers get a staged copy and still run as nobody),
-- (2) by root with the copy owned by an ordinary user (the workers run as that
-- user), (3) by that ordinary user through serve.sh (`make serve`), and (4) by
-- root through serve.sh. Each answers one completion, and no worker runs as
-- root. Cases 1, 2 and 4 need root; case 3 needs root to switch users.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local unistd = require "posix.unistd"
local stdlib = require "posix.stdlib"
local signal = require "posix.signal"
local check = T.check

local ORDINARY = "daemon"   -- an ordinary account every Debian system has (uid 1)
local is_root = unistd.geteuid() == 0


local function sh(cmd)
    local ok = os.execute(cmd)
    return ok == true or ok == 0
end


-- The uids of a master's worker processes.
local function worker_uids(master)
    local uids = {}
    local p = io.popen("pgrep -P " .. master)
    for pid in p:lines() do
        local status = T.read("/proc/" .. pid .. "/status") or ""
        uids[#uids + 1] = tonumber(status:match("\nUid:%s*(%d+)"))
    end
    p:close()
    return uids
end


local function no_root_worker(uids)
    if #uids == 0 then
        return false
    end
    for _, u in ipairs(uids) do
        if u == 0 then
            return false
        end
    end
    return true
end


local function completion(port)
    local res, err = T.post(port, "/v1/completions", { prompt = "Once upon a time", max_tokens = 4 }, nil, 20)
    if not res then
        return false, err
    end
    local text = res.json and res.json.choices and res.json.choices[1] and res.json.choices[1].text
    return res.status == 200 and type(text) == "string", res.status .. " " .. res.body:sub(1, 200)
end


-- A copy of what serving needs (lua/, the library, examples, the tools and
-- the test library) and the model as ../shared, under a fresh 0700 directory;
-- the model's own mode is 0600 (a hard link would not make it readable).
local function private_copy()
    local dir = assert(stdlib.mkdtemp((os.getenv("TMPDIR") or "/tmp") .. "/tl-private.XXXXXX"))
    local tree = dir .. "/tinyloop"
    local ok = sh(string.format("chmod 700 '%s' && mkdir -p '%s/build' '%s/tests/integration' '%s/shared/models'"
        .. " && cp -R '%s/lua' '%s/examples' '%s/' && cp '%s/build/libtinyloop.so' '%s/build/'"
        .. " && cp -R '%s/tools' '%s/' && cp '%s/tests/integration/lib.lua' '%s/tests/integration/'"
        .. " && cp '%s' '%s/shared/models/model.gguf' && chmod 600 '%s/shared/models/model.gguf'",
        dir, tree, tree, dir, T.ROOT, T.ROOT, tree, T.ROOT, tree, T.ROOT, tree, T.ROOT, tree, T.MODEL, dir, dir))
    assert(ok, "cannot copy the tree into " .. dir)
    return dir, tree, dir .. "/shared/models/model.gguf"
end


-- The test library of the copy: its ROOT is the private tree.
local function private_lib(tree, model)
    local P = dofile(tree .. "/tests/integration/lib.lua")
    P.ROOT, P.MODEL = tree, model
    return P
end


-- Starts one engine from the private copy with its lib.lua and asks it once.
local function serve_once(tag, tree, model, want_user)
    local P = private_lib(tree, model)
    local port = T.free_port()
    local srv, err = P.start{ name = tag, conf = tree .. "/examples/nginx.conf", port = port,
        env = { TINYLOOP_MODEL = model, TINYLOOP_MAX_SEQ_LEN = 256, TINYLOOP_INSTANCE = tag,
            TINYLOOP_BACKEND = "cpu" } }
    if not check(tag .. ": the engine starts and /health answers 200", srv, err) then
        P.stop_all()
        return
    end
    check(tag .. ": a completion is served", completion(port))
    local models = T.request(port, "GET", "/v1/models", nil, nil, 5)
    local id = models and models.json and models.json.data and models.json.data[1] and models.json.data[1].id
    check(tag .. ": the model keeps its name (/v1/models)", id == "model", models and models.body)
    local uids = worker_uids(srv.pid)
    check(tag .. ": no worker runs as root", no_root_worker(uids), table.concat(uids, ","))
    if want_user then
        local want = "user " .. want_user .. " " .. want_user .. ";\n"
        check(tag .. ": the workers run as " .. want_user, srv.user == want, srv.user)
    else
        check(tag .. ": nginx.conf sets no user (nobody)", srv.user == "", srv.user)
    end
    P.stop_all()
end


-- Runs serve.sh of the copy in the background (as `as_user` when given),
-- waits for /health, asks once, stops it with TERM as Ctrl-C would.
local function serve_sh_once(tag, dir, tree, model, as_user)
    local port = T.free_port()
    local log = dir .. "/serve-" .. tag .. ".log"
    local pidfile = dir .. "/serve-" .. tag .. ".pid"
    local run = as_user and string.format("setpriv --reuid=%s --regid=%s --init-groups -- ", as_user, as_user) or ""
    sh(string.format("sh -c 'echo $$ > %s; exec env MODEL=%s PORT=%d TINYLOOP_BACKEND=cpu MAX_SEQ_LEN=256 "
        .. "%s sh %s/tools/serve.sh' >%s 2>&1 &", pidfile, model, port, run, tree, log))
    local pid
    for _ = 1, 100 do
        pid = tonumber(T.read(pidfile) or "")
        if pid then
            break
        end
        T.sleep(0.05)
    end
    local up = false
    local deadline = T.now() + 20
    while pid and T.now() < deadline do
        local res = T.request(port, "GET", "/health", nil, nil, 2)
        if res and res.status == 200 then
            up = true
            break
        end
        T.sleep(0.1)
    end
    if check(tag .. ": serve.sh answers /health", up, T.read(log)) then
        check(tag .. ": serve.sh serves a completion", completion(port))
        local masters = {}
        local p = io.popen("pgrep -P " .. pid)
        for m in p:lines() do
            masters[#masters + 1] = tonumber(m)
        end
        p:close()
        local uids = masters[1] and worker_uids(masters[1]) or {}
        check(tag .. ": no serve.sh worker runs as root", no_root_worker(uids), table.concat(uids, ","))
    end
    if pid then
        signal.kill(pid, signal.SIGTERM)
        for _ = 1, 100 do
            if not T.alive(pid) then
                break
            end
            T.sleep(0.05)
        end
        check(tag .. ": serve.sh stops on TERM", not T.alive(pid))
    end
end


local ok_run, run_err = pcall(function()
    local dir, tree, model = private_copy()
    if is_root then
        serve_once("root-owned", tree, model, nil)
        serve_sh_once("serve.sh-root", dir, tree, model, nil)
        if sh("id " .. ORDINARY .. " >/dev/null 2>&1 && command -v setpriv >/dev/null") then
            sh(string.format("chown -R %s:%s '%s'", ORDINARY, ORDINARY, dir))
            serve_once("user-owned", tree, model, ORDINARY)
            serve_sh_once("serve.sh-as-" .. ORDINARY, dir, tree, model, ORDINARY)
        else
            T.skip("a checkout owned by an ordinary user", "no user " .. ORDINARY .. " or no setpriv")
        end
    else
        -- An ordinary user reads its own 0700 directory: the plain case.
        serve_once("own-private", tree, model, nil)
        serve_sh_once("serve.sh", dir, tree, model, nil)
    end
    if os.getenv("TINYLOOP_KEEP_TMP") ~= "1" then
        sh("rm -rf '" .. dir .. "'")
    end
end)
check("the private directory tests ran to the end", ok_run, run_err)
T.stop_all()
os.exit(T.summary() and 0 or 1)
