"""nbdev 2 setup: every value comes from settings.ini."""
from packaging.version import parse as parse_version
from configparser import ConfigParser
import setuptools, shlex

assert parse_version(setuptools.__version__) >= parse_version('36.2')
config = ConfigParser(delimiters=['='])
config.read('settings.ini', encoding='utf-8')
cfg = config['DEFAULT']

licenses = {'apache2': ('Apache Software License 2.0', 'OSI Approved :: Apache Software License')}
statuses = ['Planning', 'Pre-Alpha', 'Alpha', 'Beta', 'Production/Stable', 'Mature', 'Inactive']
py_versions = '3.11 3.12'.split()

requirements = shlex.split(cfg.get('requirements', ''))
extras = {name: shlex.split(cfg.get(f'{name}_requirements', '')) for name in ('dev', 'docs', 'build')}
lic = licenses[cfg['license']]
min_python = cfg['min_python']
console_scripts = cfg.get('console_scripts', '').split()
notebooks = cfg.get('package_notebooks', '').split()

setuptools.setup(
    name=cfg['lib_name'], license=lic[0], version=cfg['version'],
    description=cfg['description'], author=cfg['author'], author_email=cfg.get('author_email') or None,
    keywords=cfg['keywords'], url=cfg.get('git_url') or None, license_files=['LICENSE'],
    classifiers=['Development Status :: ' + str(cfg['status']) + ' - ' + statuses[int(cfg['status'])],
                 'Intended Audience :: ' + cfg['audience'].title(), 'License :: ' + lic[1],
                 'Natural Language :: ' + cfg['language'].title()]
                + ['Programming Language :: Python :: ' + o for o in py_versions[py_versions.index(min_python):]],
    # mtnlg.notebooks: the notebooks jobs and the demo run, shipped from their one source, nbs/ (settings.ini's
    # package_notebooks; mtnlg.jobs.find_notebook finds them by name, installed or in a clone)
    packages=setuptools.find_packages(include=['mtnlg', 'mtnlg.*']) + [cfg['lib_path'] + '.notebooks'],
    package_dir={cfg['lib_path'] + '.notebooks': cfg['nbs_path']},
    include_package_data=True, install_requires=requirements,
    package_data={'mtnlg': ['task_yamls/*.yaml'], cfg['lib_path'] + '.notebooks': notebooks},
    extras_require=extras, python_requires='>=' + min_python,
    long_description=open('README.md', encoding='utf-8').read(), long_description_content_type='text/markdown',
    zip_safe=False, entry_points={'console_scripts': console_scripts, 'nbdev': [f'{cfg["lib_path"]}={cfg["lib_path"]}._modidx:d']},
)
