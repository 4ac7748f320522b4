-- `make install` (issue 16): installs into a temporary DESTDIR and uses the
-- installed tree with the source tree off every path: pkg-config and the
-- header build a C program against the library, the CLI runs, the Lua API
-- loads stories260K and generates, and the installed examples/nginx.conf (its
-- lua_package_path pointed at the DESTDIR copy) serves a completion with the
-- installed library mapped in the worker; `make uninstall` removes it all.
package.path = debug.getinfo(1, "S").source:sub(2):match("^(.*/)") .. "?.lua;" .. package.path
local T = require "lib"
local stdlib = require "posix.stdlib"
local check = T.check


local function sh(cmd)
    local ok = os.execute(cmd)
    return ok == true or ok == 0
end


local function capture(cmd)
    local p = io.popen(cmd .. " 2>&1")
    local out = p:read("*a")
    local ok = p:close()
    return out, ok == true or ok == 0
end


local ok_run, run_err = pcall(function()
    local dest = assert(stdlib.mkdtemp((os.getenv("TMPDIR") or "/tmp") .. "/tl-install.XXXXXX"))
    sh("chmod 755 '" .. dest .. "'")   -- nginx's workers (nobody, as root) read the tree
    local prefix = dest .. "/usr/local"
    local out, ok = capture(string.format("make -s -C '%s' install DESTDIR='%s' PREFIX=/usr/local", T.ROOT, dest))
    check("make install DESTDIR= succeeds", ok, out)
    for _, f in ipairs{ "/bin/tinyloop", "/lib/libtinyloop.so", "/lib/libtinyloop.a", "/include/tinyloop.h",
        "/lib/pkgconfig/tinyloop.pc", "/share/lua/5.1/tinyloop/init.lua", "/share/lua/5.1/tinyloop/cdef.lua",
        "/share/lua/5.1/tinyloop/policy/sandbox.lua", "/share/tinyloop/policies/tenants.lua",
        "/share/tinyloop/examples/nginx.conf" } do
        check("installs " .. f, T.read(prefix .. f) ~= nil)
    end
    local pc = T.read(prefix .. "/lib/pkgconfig/tinyloop.pc") or ""
    check("tinyloop.pc names the install prefix", pc:find("\nprefix=/usr/local\n", 1, true)
        and pc:find("\nlibdir=/usr/local/lib\n", 1, true), pc)

    -- A C program built with pkg-config's flags against the installed header and library.
    T.write(dest .. "/hello.c", '#include <stdio.h>\n#include <tinyloop.h>\n'
        .. 'int main(void) { tl_model_params p = tl_model_default_params(); '
        .. 'printf("kv_block_size %d\\n", (int)p.kv_block_size); return 0; }\n')
    if not sh("command -v pkg-config >/dev/null && command -v cc >/dev/null") then
        T.skip("a C program built with pkg-config", "pkg-config or cc not installed")
    else
        local flags, pok = capture(string.format("PKG_CONFIG_SYSROOT_DIR='%s' PKG_CONFIG_PATH='%s/lib/pkgconfig' "
            .. "pkg-config --cflags --libs tinyloop", dest, prefix))
        check("pkg-config --cflags --libs tinyloop", pok and flags:find("-I" .. prefix .. "/include", 1, true), flags)
        out, ok = capture(string.format("cc -o '%s/hello' '%s/hello.c' %s && LD_LIBRARY_PATH='%s/lib' '%s/hello'",
            dest, dest, flags:gsub("\n", ""), prefix, dest))
        check("a C program builds and runs against the installed library", ok and out:find("kv_block_size %d+"), out)
    end

    -- The CLI.
    out, ok = capture(string.format("cd '%s' && '%s/bin/tinyloop' info '%s'", dest, prefix, T.MODEL))
    check("the installed CLI reads the model", ok and #out > 0, out)

    -- The Lua API from the installed modules, run outside the source tree.
    local model = dest .. "/stories260K.gguf"
    sh(string.format("cp '%s' '%s' && chmod 644 '%s'", T.MODEL, model, model))
    local lua_path = prefix .. "/share/lua/5.1/?.lua;" .. prefix .. "/share/lua/5.1/?/init.lua"
    T.write(dest .. "/api.lua", [[
local tl = require "tinyloop"
local m = tl.Model(arg[1], { max_seq_len = 128 })
local ids = m:generate(m:tokenize("Once upon a time"), { max_tokens = 8, temperature = 0 })
print("lib " .. require("tinyloop.lib").path)
print("module " .. package.searchpath("tinyloop", package.path))
print("generated " .. #ids)
]])
    out, ok = capture(string.format("cd '%s' && env -u TINYLOOP_LIB TINYLOOP_BACKEND=cpu LUA_PATH='%s' "
        .. "luajit api.lua '%s'", dest, lua_path, model))
    check("the Lua API generates from the installed tree", ok and out:find("generated 8", 1, true), out)
    local libpath = out:match("lib (%S+)")
    check("the Lua API loads the installed library",
        libpath and stdlib.realpath(libpath) == stdlib.realpath(prefix .. "/lib/libtinyloop.so"), out)
    check("the Lua API uses the installed modules", out:find("module " .. prefix .. "/share/lua/5.1/tinyloop/init.lua",
        1, true), out)

    -- nginx with the installed examples/nginx.conf.
    local port = T.free_port()
    local esc = ("/usr/local/share/lua/5.1"):gsub("%p", "%%%0")
    local srv, err = T.start{ name = "installed", bare = true, conf = prefix .. "/share/tinyloop/examples/nginx.conf",
        port = port, subst = { { esc, (prefix .. "/share/lua/5.1"):gsub("%%", "%%%%") } },
        env = { TINYLOOP_MODEL = model, TINYLOOP_MAX_SEQ_LEN = 256, TINYLOOP_BACKEND = "cpu", TINYLOOP_LIB = "" } }
    if check("nginx starts from the installed examples/nginx.conf", srv, err) then
        local res = T.post(port, "/v1/completions", { prompt = "Once upon a time", max_tokens = 4 }, nil, 20)
        check("the installed server answers a completion", res and res.status == 200 and res.json
            and res.json.choices, res and res.body)
        local maps = ""
        local p = io.popen("pgrep -P " .. srv.pid)
        for pid in p:lines() do
            maps = maps .. (T.read("/proc/" .. pid .. "/maps") or "")
        end
        p:close()
        check("the worker maps the installed library", maps:find(prefix .. "/lib/libtinyloop.so", 1, true))
        check("the worker maps nothing from the source tree", not maps:find(T.ROOT .. "/", 1, true))
        T.stop(srv)
    end

    out, ok = capture(string.format("make -s -C '%s' uninstall DESTDIR='%s' PREFIX=/usr/local && find '%s' -type f",
        T.ROOT, dest, prefix))
    check("make uninstall removes every installed file", ok and out == "", out)
    if os.getenv("TINYLOOP_KEEP_TMP") ~= "1" then
        sh("rm -rf '" .. dest .. "'")
    end
end)
check("the install tests ran to the end", ok_run, run_err)
T.stop_all()
os.exit(T.summary() and 0 or 1)
