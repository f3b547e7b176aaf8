# mod_wsgi's script for acceld's public API (etc/apache2/acceld-api.conf): the configuration
# files in the process environment before acceld.wsgi.api reads it at import.
import os

os.environ.setdefault("OS_ACCELD_CONFIG_FILES", "/etc/acceld/acceld.conf")

from acceld.wsgi.api import application  # noqa: E402,F401 - what mod_wsgi serves
