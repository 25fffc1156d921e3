"""JupyterHub's configuration for the class (``scripts/hub.py up`` writes the settings it reads:
``$COURSE_HUB_SETTINGS``, a JSON file in the hub's private folder).

Accounts: FirstUseAuthenticator, the roster's students and the instructor (and graders) only,
each with a first password given before the hub starts (hub/accounts.py). Servers: CourseSpawner
(hub/spawner.py). Services: the formgrader (nbgrader's, with the course's inert pages), reachable
by the instructor and graders only; jupyterhub-idle-culler.
"""

import json
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (JupyterHub provides it)

S = json.loads(Path(os.environ["COURSE_HUB_SETTINGS"]).read_text())
STATE, PRIVATE = Path(S["state"]), Path(S["private"])
BIN = Path(sys.executable).parent

c.JupyterHub.ip = S["ip"]
c.JupyterHub.port = S["port"]
c.JupyterHub.hub_port = S["hub_port"]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{S['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [S["proxy"]]
c.ConfigurableHTTPProxy.should_start = True
c.JupyterHub.db_url = f"sqlite:///{PRIVATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(PRIVATE / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(PRIVATE / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True      # Ctrl-C / SIGTERM stops every student's server
c.JupyterHub.cleanup_proxy = True
c.JupyterHub.shutdown_on_logout = False


def _landing(handler):
    """Students land in their JupyterLab; the instructor and graders on the formgrader."""
    user = handler.current_user
    return "/services/formgrader/" if user is not None and user.name in S["staff"] \
        else "/hub/spawn"


c.JupyterHub.default_url = _landing

c.JupyterHub.authenticator_class = "firstuseauthenticator.FirstUseAuthenticator"
c.FirstUseAuthenticator.dbm_path = str(PRIVATE / "passwords.dbm")
c.FirstUseAuthenticator.create_users = False   # (only the hub's users: the roster and staff)
c.FirstUseAuthenticator.min_password_length = 10
c.Authenticator.allowed_users = set(S["students"]) | set(S["staff"])
c.Authenticator.admin_users = {S["instructor"]}
c.Authenticator.allow_all = False

# each student's server: a process of this machine, or a Slurm job (batchspawner)
c.JupyterHub.spawner_class = {"local": "hub.spawner.CourseSpawner",
                              "slurm": "hub.spawner.CourseSlurmSpawner"}[S["spawner"]]
c.StudentServer.course_dir = S["course_dir"]
c.StudentServer.memory_bytes = S["memory_bytes"]
c.StudentServer.cpus = S["cpus"]
c.StudentServer.exchange = S["exchange"]
c.StudentServer.student_config = S["student_config"]
c.CourseSlurmSpawner.logs = str(PRIVATE / "slurm")
c.Spawner.notebook_dir = "~/workspace"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120
c.Spawner.env_keep = ["LANG", "LC_ALL", "SLURM_CONF"]  # (sbatch and squeue find the cluster)
c.Spawner.environment = {
    "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
    "PYTHONPATH": S["course_dir"],          # course_utils: the students' copy's
    "JUPYTER_CONFIG_PATH": S["student_config"],
    "IPYTHONDIR": "~/workspace/.ipython",
    "MPLCONFIGDIR": "/tmp/mpl-{username}",
}

formgrader_port = S["formgrader_port"]
NO_EXCHANGE = "/nonexistent/on-the-class-hub-use-scripts-hub.py-release-collect-feedback"
c.JupyterHub.services = [
    {
        "name": "formgrader",
        "url": f"http://127.0.0.1:{formgrader_port}",
        "command": [str(BIN / "jupyterhub-singleuser"), "--allow-root",
                    f"--ServerApp.port={formgrader_port}", "--ServerApp.ip=127.0.0.1",
                    f"--ServerApp.root_dir={S['repo']}", "--ServerApp.terminals_enabled=False",
                    "--ServerApp.default_url=/formgrader"],
        "cwd": S["repo"],
        # its Release/Collect/Feedback buttons would run nbgrader's own exchange steps (no
        # owner check at collect, the root left 0777): off (nbgrader_config.py reads
        # COURSE_EXCHANGE), and its warning shows this path, which names the way
        "environment": {"COURSE_DATA": S["data"], "PATH": f"{BIN}:/usr/bin:/bin",
                        "COURSE_EXCHANGE": NO_EXCHANGE},
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": ["access:services!service=formgrader"],
    },
    {
        "name": "idle-culler",
        "command": [sys.executable, "-m", "jupyterhub_idle_culler",
                    f"--timeout={S['cull_timeout']}", f"--cull-every={S['cull_every']}"],
    },
]
c.JupyterHub.load_groups = {"formgraders": {"users": sorted(S["staff"])}}
c.JupyterHub.load_roles = [
    {"name": "formgraders", "groups": ["formgraders"],
     "scopes": ["access:services!service=formgrader"]},
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]
